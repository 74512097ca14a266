"""FP8 producer fusion: an adaLN modulation (alone, or after a gated residual) whose only reader
is a row-quantized FP8 GEMM emits the FP8 values and scales itself.

    m = kopt.adaln_modulation(x, scale, shift, ...);  q, s = quantize_rows(m.view(M, N))
  → q, s = kopt.adaln_modulation_quant(x, scale, shift, ...)

    r_new, m = kopt.gated_residual(r, y, gate, scale, shift);  q, s = quantize_rows(m.view(M, N))
  → r_new, q, s = kopt.gated_residual_quant(r, y, gate, scale, shift)

Why: the bf16 modulated norm is written once and read back once only to be quantized; the row
kernel already holds the whole row, so it can take the amax and write FP8 directly (half the
bytes written, none read back). Valid when the GEMM's A operand is the row-wise quantization
``fp8-linear`` emits (checked node by node) and nothing else reads the bf16 output. Contract:
exact — the kernel rounds the modulated value to x's dtype as the bf16 op does, then quantizes
with the same formula. ``fp8_pipeline`` runs it after the norm fusions with row scales; other
granularities have no such kernels, so there the norm fusions are left out and Inductor fuses its
own norm and quantize instead.
"""

from __future__ import annotations

import operator

import torch

from kopt.fx.graph_utils import RESHAPES, stamp
from kopt.kernels import adaln_modulation as _registers_bf16  # noqa: F401  (torch.ops.kopt.adaln_modulation)
from kopt.kernels import adaln_modulation_quant as _registers_the_op  # noqa: F401
from kopt.kernels import gated_residual as _registers_gated  # noqa: F401  (torch.ops.kopt.gated_residual)
from kopt.kernels import gated_residual_quant as _registers_gated_quant  # noqa: F401
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches
from kopt.passes.fp8.activation_quant import row_quantization

aten = torch.ops.aten
RULE = "adaln-quant"
GATED_RULE = "gated-residual-quant"


def match(gemm: torch.fx.Node) -> tuple[str, torch.fx.Node] | str | None:
    """(rule, the kopt op) feeding ``gemm``'s row quantization — an adaln_modulation, or output 1 of a
    gated_residual — or why not; None when the activation is neither (not a candidate)."""
    found = row_quantization(gemm)
    if isinstance(found, str):
        return None
    activation, _ = found
    source = activation.args[0] if activation.target in RESHAPES else activation
    if source is not activation and len(activation.users) != 1:
        return "the 2-D view of the modulated value is read elsewhere"
    if isinstance(source, torch.fx.Node) and source.target is torch.ops.kopt.adaln_modulation.default:
        if len(source.users) != 1:
            return "the bf16 adaLN output is read elsewhere: it must still be written"
        return RULE, source
    if (isinstance(source, torch.fx.Node) and source.target is operator.getitem and source.args[1] == 1
            and source.args[0].target is torch.ops.kopt.gated_residual.default):
        if len(source.users) != 1:
            return "the bf16 modulated value of the gated residual is read elsewhere: it must still be written"
        return GATED_RULE, source.args[0]
    return None


class FuseAdaLNQuant(Pass):
    name = "fuse-adaln-quant"
    why = "the adaLN (and gated-residual) kernels write the FP8 input of the next GEMM and its row scales"
    contract = Contract.exact()

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for gemm, (rule, op) in accepted_matches(graph, aten._scaled_mm.default, match, ctx, RULE,
                                                 rule_of=lambda found: found[0]):
            quantized = (torch.ops.kopt.adaln_modulation_quant.default if rule == RULE
                         else torch.ops.kopt.gated_residual_quant.default)
            first = 0 if rule == RULE else 1  # gated_residual_quant returns (r_new, q, s)
            with graph.inserting_before(op):  # where the bf16 op was: its inputs exist, its users follow
                fused = graph.call_function(quantized, op.args, op.kwargs)
                q = graph.call_function(operator.getitem, (fused, first))
                scale = graph.call_function(operator.getitem, (fused, first + 1))
                residual = graph.call_function(operator.getitem, (fused, 0)) if rule == GATED_RULE else None
            stamp(fused, pass_name=self.name, rule=rule)
            if residual is not None:  # the residual stream keeps flowing from the new op
                for user in list(op.users):
                    if user.target is operator.getitem and user.args[1] == 0:
                        user.replace_all_uses_with(residual)
            old_q, old_scale = gemm.args[0], gemm.args[2]
            gemm.replace_input_with(old_q, q)
            gemm.replace_input_with(old_scale, scale)
        graph.eliminate_dead_code()
