"""FP8 producer fusion: an adaLN modulation whose only reader is a row-quantized FP8 GEMM emits the
FP8 values and scales itself (``kopt::adaln_modulation_quant``).

    m = kopt.adaln_modulation(x, scale, shift, ...);  q, s = quantize_rows(m.view(M, N))
  → q, s = kopt.adaln_modulation_quant(x, scale, shift, ...)

Why: the bf16 modulated norm is written once and read back once only to be quantized; the row
kernel already holds the whole row, so it can take the amax and write FP8 directly (half the
bytes written, none read back). Valid when the GEMM's A operand is the row-wise quantization
``fp8-linear`` emits (checked node by node) and nothing else reads the bf16 output. Contract:
exact — the kernel rounds the modulated value to x's dtype as the bf16 op does, then quantizes
with the same formula. Opt-in until measured on a GPU: name ``fuse-adaln`` and this pass with
``fp8=...`` (``"auto"`` drops ``fuse-adaln`` under FP8 and lets Inductor fuse its own norm and
quantize instead).
"""

from __future__ import annotations

import operator

import torch

from kopt.fx.graph_utils import stamp
from kopt.kernels import adaln_modulation as _registers_bf16  # noqa: F401  (torch.ops.kopt.adaln_modulation)
from kopt.kernels import adaln_modulation_quant as _registers_the_op  # noqa: F401
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches
from kopt.passes.fuse_activation_quant import row_quantization

aten = torch.ops.aten
RULE = "adaln-quant"
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def match(gemm: torch.fx.Node) -> torch.fx.Node | str | None:
    """The ``kopt::adaln_modulation`` node feeding ``gemm``'s row quantization, or why not; None when
    the GEMM's activation is no adaLN output at all (not a candidate)."""
    found = row_quantization(gemm)
    if isinstance(found, str):
        return None
    activation, _ = found
    source = activation.args[0] if activation.target in _VIEWS else activation
    if not (isinstance(source, torch.fx.Node) and source.target is torch.ops.kopt.adaln_modulation.default):
        return None
    if len(source.users) != 1:
        return "the bf16 adaLN output is read elsewhere: it must still be written"
    if source is not activation and len(activation.users) != 1:
        return "the 2-D view of the adaLN output is read elsewhere"
    return source


class FuseAdaLNQuant(Pass):
    name = "fuse-adaln-quant"
    why = "the adaLN kernel writes the FP8 input of the next GEMM and its row scales (no bf16 round trip)"
    contract = Contract.exact()

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for gemm, adaln in accepted_matches(graph, aten._scaled_mm.default, match, ctx, RULE):
            with graph.inserting_before(gemm):
                fused = graph.call_function(torch.ops.kopt.adaln_modulation_quant.default, adaln.args, adaln.kwargs)
                q = graph.call_function(operator.getitem, (fused, 0))
                scale = graph.call_function(operator.getitem, (fused, 1))
            for node in (fused, q, scale):
                stamp(node, pass_name=self.name, rule=RULE)
            old_q, old_scale = gemm.args[0], gemm.args[2]
            gemm.replace_input_with(old_q, q)
            gemm.replace_input_with(old_scale, scale)
        graph.eliminate_dead_code()
