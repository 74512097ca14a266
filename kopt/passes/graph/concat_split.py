"""A linear over a concatenation becomes one GEMM per part, each adding into the previous one.

    y = addmm(b, view(cat([A, B], -1), [M, K]), Wt)          (mm(...) without a bias)
  → y = addmm(addmm(b, A', Wt[:ka]), B', Wt[ka:])             (A', B': A and B as [M, ka], [M, kb])

and where a part is the tanh GELU of a linear read by nothing else, that part is
``kopt.linear_gelu_tanh(x, W2t, b2)``: the GELU runs in its GEMM's epilogue.

FLUX.1's and Chroma's single-stream blocks compute ``proj_out(cat([attention, gelu(proj_mlp(x))]))``.
Left to Inductor, the GELU is fused into the concatenation's copy, a kernel that reads and writes the
whole (tokens × (3072 + 12288)) activation: 4.6 ms of FLUX.1's 126 ms forward on an H200
(``benchmarks/results/dit-full-flux1-s18b.json``). Split, nothing is concatenated: each part is read
once, by its own GEMM, and the MLP's GELU moves into ``proj_mlp``'s epilogue. This pass runs before
``sibling-merge`` (:attr:`runs_before`), which would otherwise merge ``proj_mlp`` into the Q/K/V GEMM
that reads the same input, where only some of the columns take the GELU.

Only where it saves bytes. A part that is a GEMM's or an elementwise op's output is written once and
read once with or without the concatenation (Inductor fuses an elementwise part into the copy that
writes the concatenation; split, the same op writes the part and the GEMM reads it), so the split alone
saves nothing and adds a GEMM per part, each reading back the partial sum. What it saves is a part's
producer moving into a GEMM's epilogue: the tanh GELU of a linear read by nothing else is then never
written before the GELU (FLUX.1: tokens × 12288 bf16 values written and read once less per
single-stream block). So at least one part must be such a GELU (FLUX.2's SwiGLU part is left alone),
and the concatenation must be wider than the partial sums the extra GEMMs read back, K > (parts − 1) ×
N (FLUX.1: 15360 against 3072).

Valid: a product distributes over a partition of its reduction dimension,
``cat([A, B]) @ Wt = A @ Wt[:ka] + B @ Wt[ka:]``. Contract: tolerance — each partial product is
rounded to the dtype before the next GEMM adds to it (one more rounding per part than the single
GEMM), and the epilogue applies the GELU to the float32 accumulator before its one rounding.

In ``"auto"`` for bf16 (FLUX.1 full on an H200: 125.02 ms per forward against 126.54 without it,
``benchmarks/results/dit-full-flux1-s31f.json``). Not in the FP8 pipeline: the weight slices are views
of the original weight, so ``fp8-linear`` (which quantizes whole constant weights) would leave the
split GEMMs in bf16.
"""

from __future__ import annotations

import dataclasses

import torch

from kopt.fx.graph_utils import RESHAPES, meta_value, replace, stamp
from kopt.fx.symbolic import static_int
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches
from kopt.passes.fuse import linear_gelu

aten = torch.ops.aten
RULE = "split-concat-linear"


@dataclasses.dataclass
class ConcatLinear:
    """A GEMM whose left operand is a last-dimension concatenation (through one reshape at most)."""

    gemm: torch.fx.Node
    parts: list[torch.fx.Node]
    widths: list[int]
    rows: list[object] | None  # the reshape's sizes with the width last (None: the cat is already 2-D)
    bias: object | None
    weight_t: torch.fx.Node


def _operands(gemm: torch.fx.Node) -> tuple[object, object, object] | str:
    """(bias or None, x, Wt) of ``addmm(b, x, Wt)`` or ``mm(x, Wt)``."""
    if gemm.target is aten.mm.default:
        return None, gemm.args[0], gemm.args[1]
    if gemm.kwargs.get("beta", 1) != 1 or gemm.kwargs.get("alpha", 1) != 1:
        return "addmm with alpha/beta other than 1"
    return gemm.args[0], gemm.args[1], gemm.args[2]


def match(gemm: torch.fx.Node) -> ConcatLinear | str | None:
    """The concatenated linear at ``gemm``, or why it cannot be split (None: no concatenation)."""
    operands = _operands(gemm)
    if isinstance(operands, str):
        return operands
    bias, x, weight_t = operands
    if not isinstance(x, torch.fx.Node) or not isinstance(weight_t, torch.fx.Node):
        return None
    cat = x.args[0] if x.target in RESHAPES else x
    if not isinstance(cat, torch.fx.Node) or cat.target is not aten.cat.default:
        return None
    if len(cat.users) != 1 or (cat is not x and len(x.users) != 1):
        return "the concatenation is read elsewhere too: it would still be written"
    cat_value, x_value = meta_value(cat), meta_value(x)
    parts = list(cat.args[0])
    if cat_value is None or x_value is None or len(parts) < 2:
        return "no shape metadata, or a single part"
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if dim % cat_value.dim() != cat_value.dim() - 1:
        return "not concatenated along the last dimension (the GEMM's reduction dimension)"
    if static_int(x_value.shape[-1]) != static_int(cat_value.shape[-1]):
        return "the reshape between the concatenation and the GEMM moves the reduction dimension"
    values = [meta_value(p) if isinstance(p, torch.fx.Node) else None for p in parts]
    widths = [static_int(v.shape[-1]) if v is not None else None for v in values]
    if None in widths or any(v.dtype != x_value.dtype for v in values):  # type: ignore[union-attr]
        return "a part with a dynamic width, no metadata or another dtype"
    if any(w == 0 for w in widths):
        return "an empty part"
    out = meta_value(gemm)
    width = static_int(out.shape[-1]) if out is not None else None
    if width is None or sum(widths) <= (len(parts) - 1) * width:  # type: ignore[arg-type]
        return (f"the concatenation ({sum(widths)} wide) is not wider than the partial sums the extra "  # type: ignore[arg-type]
                f"GEMMs would read back ({len(parts) - 1} x {width}): splitting would move more bytes")
    if not any(isinstance(p, torch.fx.Node) and _moves_into_epilogue(p) for p in parts):
        return ("no part's producer moves into a GEMM epilogue (a tanh GELU of a linear read by nothing else): "
                "each part is written and read once with or without the concatenation, so splitting would only "
                "add GEMMs")
    rows = None
    if cat is not x:
        rows = list(x.args[1])
        if len(rows) != 2:
            return "the reshape does not give the GEMM's 2-D operand"
    return ConcatLinear(gemm, parts, widths, rows, bias, weight_t)  # type: ignore[arg-type]


def _moves_into_epilogue(part: torch.fx.Node) -> bool:
    """Whether ``part`` is the tanh GELU of a linear that a split would run in the linear's epilogue."""
    if part.target is not aten.gelu.default or len(part.users) != 1:  # read elsewhere: the GEMM would run twice
        return False
    found = linear_gelu.match(part)
    return found is not None and not isinstance(found, str)


def _epilogue_part(graph: torch.fx.Graph, part: torch.fx.Node, ctx: PassContext, pass_name: str) -> torch.fx.Node:
    """``part`` itself, or, when it is the tanh GELU of a linear read by nothing else (and the GELU by
    nothing but the concatenation), that linear with the GELU in its epilogue
    (:mod:`kopt.passes.fuse.linear_gelu`'s conditions)."""
    if part.target is not aten.gelu.default or len(part.users) != 1:  # read elsewhere: the GEMM would run twice
        return part
    found = linear_gelu.match(part)
    if found is None:
        return part
    if isinstance(found, str):
        ctx.decline(RULE, part, f"GELU part left to Inductor: {found}")
        return part
    fused = linear_gelu.emit(graph, found)
    stamp(fused, pass_name=pass_name, rule=RULE)
    return fused


class SplitConcatLinear(Pass):
    name = "split-concat-linear"
    why = ("a linear over a concatenation is one GEMM per part, each adding into the last: the "
           "concatenation is never written, and a GELU part runs in its GEMM's epilogue")
    contract = Contract.tolerance(1e-2)
    runs_before = "sibling-merge"

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for target in (aten.addmm.default, aten.mm.default):
            for _, found in accepted_matches(graph, target, match, ctx, RULE):
                self._split(graph, found, ctx)
        graph.eliminate_dead_code()

    def _split(self, graph: torch.fx.Graph, found: ConcatLinear, ctx: PassContext) -> None:
        gemm = found.gemm

        def call(target: object, args: tuple[object, ...]) -> torch.fx.Node:
            node = graph.call_function(target, args)
            stamp(node, pass_name=self.name, rule=RULE)
            return node

        with graph.inserting_before(gemm):
            total, start = found.bias, 0
            for part, width in zip(found.parts, found.widths, strict=True):
                operand = _epilogue_part(graph, part, ctx, self.name)
                if found.rows is not None:
                    operand = call(aten.reshape.default, (operand, [*found.rows[:-1], width]))
                rows_of_weight = call(aten.slice.Tensor, (found.weight_t, 0, start, start + width))
                if total is None:
                    total = call(aten.mm.default, (operand, rows_of_weight))
                else:
                    total = call(aten.addmm.default, (total, operand, rows_of_weight))
                start += width
        replace(gemm, total, pass_name=self.name, rule=RULE)  # type: ignore[arg-type]
        graph.erase_node(gemm)
