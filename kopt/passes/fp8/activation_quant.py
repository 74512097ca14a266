"""FP8 producer fusion: the row-wise quantization of an activation (SwiGLU or GELU-tanh, behind an
optional prefix) moves into one ``kopt::activation_quant`` kernel that emits the FP8 values and
their scales.

    y = cat([prefix, act(h)], -1).view(M, K)                               (or without the prefix)
    q, s = quantize_rows(y);  out = _scaled_mm(q, W8.T, s, sW, ...)         (as ``fp8-linear`` wrote it)
  → q, s = kopt.activation_quant(h, prefix, act);  out = _scaled_mm(q, W8.T, s, sW, ...)

with ``act(h)`` = ``silu(h[..., :F]) * h[..., F:]`` (SwiGLU) or ``gelu(h, approximate="tanh")``.

Why: unfused, the bf16 activation is computed twice and its input read twice from memory (one
kernel for the row amax, one to write q), the "activation output read back for quantization" of the
production report; the kernel reads each row once from DRAM. Valid when the quantization is the
row-wise one ``fp8-linear`` emits (checked node by node) and nothing else reads the bf16
activation or its float32 copy (else it would be computed twice). Contract: exact — the kernel
rounds each activation step to h's dtype as the graph does and quantizes with the same formula;
only the order of float32 operations inside silu/tanh may differ (checked in the tests).
"""

from __future__ import annotations

import operator

import torch

from kopt.fp8.quantize import FP8, FP8_MAX, MIN_AMAX
from kopt.fx.graph_utils import RESHAPES, calls, meta_value, only_user, stamp
from kopt.fx.symbolic import static_int
from kopt.kernels import activation_quant as _registers_the_op  # noqa: F401  (torch.ops.kopt.activation_quant)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULES = {"swiglu": "swiglu-quant", "gelu_tanh": "gelu-tanh-quant"}
_END = 2**62


def row_quantization(gemm: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | str:
    """(the bf16 activation, the float32 copy) if ``gemm``'s A operand and scale are fp8-linear's
    row-wise quantization of one activation, else why not."""
    q, scale = gemm.args[0], gemm.args[2]
    if not (calls(q, aten._to_copy.default) and q.kwargs.get("dtype") == FP8):
        return "the FP8 GEMM's input is not a cast to float8_e4m3fn"
    clamp = q.args[0]
    if not (calls(clamp, aten.clamp.default) and list(clamp.args[1:]) == [-FP8_MAX, FP8_MAX]):
        return "not clamped to ±448 before the cast"
    scaled = clamp.args[0]
    if not (calls(scaled, aten.div.Tensor) and scaled.args[1] is scale):
        return "not divided by the GEMM's own activation scale"
    xf = scaled.args[0]
    if not (calls(scale, aten.div.Tensor) and scale.args[1] == FP8_MAX and calls(scale.args[0], aten.clamp_min.default)
            and scale.args[0].args[1] == MIN_AMAX):
        return "the activation scale is not max(amax, 1e-12) / 448"
    amax = scale.args[0].args[0]
    if not (calls(amax, aten.amax.default) and list(amax.args[1]) == [-1] and amax.args[2] is True
            and calls(amax.args[0], aten.abs.default) and amax.args[0].args[0] is xf):
        return "the scale is not the per-row amax of |x| (not row-wise granularity)"
    if not (calls(xf, aten._to_copy.default) and xf.kwargs.get("dtype") == torch.float32):
        return "the quantized value is not a float32 copy of the activation"
    if set(xf.users) != {amax.args[0], scaled}:
        return "the float32 activation is read by more than the quantization"
    return xf.args[0], xf


def _swiglu(node: object) -> torch.fx.Node | str:
    """h if ``node`` is ``silu(h[..., :F]) * h[..., F:2F]`` with h's last dim 2F, else why not."""
    if not calls(node, aten.mul.Tensor):
        return "the activation is not a product (SwiGLU)"
    a, b = node.args[:2]
    if not calls(a, aten.silu.default):
        a, b = b, a
    if not calls(a, aten.silu.default):
        return "no silu factor: not SwiGLU"
    gate, up = a.args[0], b
    if not (calls(gate, aten.slice.Tensor) and calls(up, aten.slice.Tensor) and gate.args[0] is up.args[0]):
        return "the SwiGLU halves are not slices of one tensor"
    h = gate.args[0]
    h_val = meta_value(h)
    width = static_int(h_val.shape[-1]) if h_val is not None and h_val.dim() else None
    if width is None:
        return "the SwiGLU input's last dim is unknown or symbolic"
    if width % 2:
        return "the SwiGLU input has an odd last dim"
    f, last = width // 2, h_val.dim() - 1
    gate_slice = (gate.args[1] in (-1, last), gate.args[2] if len(gate.args) > 2 else 0, gate.args[3])
    up_slice = (up.args[1] in (-1, last), up.args[2], up.args[3] if len(up.args) > 3 else _END)
    if gate_slice != (True, 0, f) or up_slice[:2] != (True, f) or not isinstance(up_slice[2], int) \
            or up_slice[2] < 2 * f:
        return "the halves are not h[..., :F] (through silu) and h[..., F:]"
    if len(node.users) != 1:
        return "the SwiGLU output is read elsewhere: it would be computed twice"
    return h


def _gelu_tanh(node: torch.fx.Node) -> torch.fx.Node | str:
    """h if ``node`` is ``gelu(h, approximate="tanh")`` read by nothing else, else why not."""
    if node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") != "tanh":
        return "exact (erf) GELU: the kernel implements the tanh approximation"
    if len(node.users) != 1:
        return "the GELU output is read elsewhere: it would be computed twice"
    return node.args[0]


def match(gemm: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node | None, str] | str | None:
    """(h, prefix, act) for an FP8 GEMM whose A operand is a row-quantized [prefix ++] activation, or
    why not; None for FP8 GEMMs whose activation is neither a product nor a GELU (not candidates)."""
    found = row_quantization(gemm)
    if isinstance(found, str):
        return found
    activation, _ = found
    source = activation.args[0] if activation.target in RESHAPES else activation
    if only_user(source) is None and source is not activation:
        return "the activation before its 2-D view is read elsewhere"
    prefix = None
    if calls(source, aten.cat.default):
        parts, dim = source.args[0], source.args[1] if len(source.args) > 1 else 0
        if len(parts) != 2 or dim not in (-1, meta_value(source).dim() - 1):
            return "a cat of other than [prefix, activation] along the last dim"
        prefix, source = parts
    if calls(source, aten.mul.Tensor):
        act, h = "swiglu", _swiglu(source)
    elif calls(source, aten.gelu.default):
        act, h = "gelu_tanh", _gelu_tanh(source)
    else:
        return None
    if isinstance(h, str):
        return h
    if prefix is not None and meta_value(prefix).dtype != meta_value(h).dtype:
        return "the prefix and the activation have different dtypes"
    return h, prefix, act


class FuseActivationQuant(Pass):
    name = "fuse-activation-quant"
    why = ("an activation (SwiGLU, GELU-tanh; after an optional prefix) and its row-wise FP8 quantization in one "
           "kernel: the input is read once")
    contract = Contract.exact()

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for gemm, (h, prefix, act) in accepted_matches(graph, aten._scaled_mm.default, match, ctx, "activation-quant",
                                                       rule_of=lambda found: RULES[found[2]]):
            with graph.inserting_before(gemm):
                fused = graph.call_function(torch.ops.kopt.activation_quant.default, (h, prefix, act))
                q = graph.call_function(operator.getitem, (fused, 0))
                scale = graph.call_function(operator.getitem, (fused, 1))
            for node in (fused, q, scale):
                stamp(node, pass_name=self.name, rule=RULES[act])
            old_q, old_scale = gemm.args[0], gemm.args[2]
            gemm.replace_input_with(old_q, q)
            gemm.replace_input_with(old_scale, scale)
        graph.eliminate_dead_code()
