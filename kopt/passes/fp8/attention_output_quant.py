"""FP8 producer fusion for attention: the row-wise quantization of the attention output, which the
projections after it (``fp8-linear``) read, moves into the attention kernel.

    o = kopt.fp8_attention(q, k, v, ...)                      (B, H, S, D)
    x = o.permute(0, 2, 1, 3).view(B, S, H·D)[:, a:b].view(M, H·D)       (one per projection)
    q8, s = quantize_rows(x);  out = _scaled_mm(q8, W8.T, s, sW, ...)
  → o8, s_o = kopt.fp8_attention_quant(q, k, v, ...)        (FP8 output, (B, S) row scales)
    out = _scaled_mm(o8.permute(...).view(...)[:, a:b].view(M, H·D), W8.T, s_o[:, a:b].reshape(M, 1), sW, ...)

Why: a row of the projection's input spans every head, which separate attention programs compute,
so its row-wise quantization was a kernel of its own reading back the bf16 output (Qwen-Image: the
text and image projections after each of its 60 joint attentions). The attention kernel instead
writes FP8 with a scale that bounds every output before any is computed (softmax weights sum to
one, so |o| ≤ max |V|; :mod:`kopt.kernels.fp8_attention_quant`).

Valid when every reader of the attention output is such a quantization, reached through the
head-merging permute and view, an optional slice of the sequence and the 2-D view ``fp8-linear``
made; a bf16 reader (FLUX.2's single-stream blocks concatenate the output with the MLP's) would
need the bf16 output too, so the attention is left alone, with that reason; so is an attention whose
sequence length is symbolic (dynamic shapes), whose row ranges are not known. The scale differs
from the row's own amax, so the contract is ``quality`` (the FP8 gate), as for ``fp8-attention``.
"""

from __future__ import annotations

import operator

import torch

from kopt.fp8.config import Fp8Config
from kopt.fp8.quantize import FP8
from kopt.fx.graph_utils import RESHAPES, calls, meta_value, stamp, swaps_dims_1_and_2
from kopt.fx.symbolic import static_int
from kopt.kernels import fp8_attention_quant as kernel
from kopt.passes.base import PassContext, accepted_matches
from kopt.passes.fp8.activation_quant import row_quantization
from kopt.passes.fp8.base import Fp8Pass

aten = torch.ops.aten
RULE = "attention-output-quant"
_HEAD_MERGE = [0, 2, 1, 3]  # (B, H, S, D) -> (B, S, H, D)


def _quantizing_gemm(x: torch.fx.Node) -> torch.fx.Node | str:
    """The FP8 GEMM whose row-quantized A operand is ``x`` (a 2-D view), else why not."""
    if len(x.users) != 1:
        return "a 2-D view of the output is read by more than one quantization"
    (xf,) = x.users
    gemms = {g for d in xf.users if calls(d, aten.div.Tensor) for c in d.users if calls(c, aten.clamp.default)
             for cast in c.users for g in cast.users if calls(g, aten._scaled_mm.default)}
    if len(gemms) != 1:
        return "the output is read by something other than an FP8 GEMM's row quantization"
    (gemm,) = gemms
    found = row_quantization(gemm)
    if isinstance(found, str):
        return found
    if found[0] is not x:
        return "the FP8 GEMM quantizes another tensor"
    return gemm


def _sequence_slice(node: torch.fx.Node, seq: int) -> tuple[int, int] | str:
    """(start, end) of ``x[:, start:end]`` on the sequence dim of a (B, S, H·D) tensor, else why not."""
    dim, start, end = (list(node.args[1:]) + [0, None, None])[:3]
    if dim != 1 or len(node.args) > 4 and node.args[4] != 1:
        return "a slice of the output other than a contiguous range of the sequence"
    start = 0 if start is None else start
    end = seq if end is None else min(end, seq)
    return start, end


def _sequence_parts(merged: torch.fx.Node, seq: int) -> list[tuple[torch.fx.Node, tuple[int, int]]] | str:
    """(reader, the sequence rows it reads) for each reader of the (B, S, H·D) output: a slice or a
    split piece along the sequence (then its one reader), or the whole of it; else why not."""
    parts: list[tuple[torch.fx.Node, tuple[int, int]]] = []
    for part in merged.users:
        if calls(part, aten.slice.Tensor):
            rows = _sequence_slice(part, seq)
            pieces = [(part, rows)] if not isinstance(rows, str) else rows
        elif calls(part, aten.split_with_sizes.default, aten.split.Tensor):
            pieces = _split_pieces(part, seq)
        else:
            parts.append((part, (0, seq)))
            continue
        if isinstance(pieces, str):
            return pieces
        for piece, rows in pieces:
            if len(piece.users) != 1:
                return "a piece of the sequence is read more than once"
            reader = next(iter(piece.users))
            if calls(reader, aten.clone.default) and len(reader.users) == 1:  # made contiguous to be viewed as 2-D
                reader = next(iter(reader.users))
            parts.append((reader, rows))
    return parts


def _split_pieces(split: torch.fx.Node, seq: int) -> list[tuple[torch.fx.Node, tuple[int, int]]] | str:
    """(getitem, rows) for each piece of a split of the sequence dim, else why not."""
    sizes, dim = split.args[1], split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    if dim != 1:
        return "a split of the output other than along the sequence"
    if isinstance(sizes, int):
        sizes = [min(sizes, seq - start) for start in range(0, seq, sizes)]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    pieces = []
    for user in split.users:
        if user.target is not operator.getitem:
            return "a split of the output read other than piece by piece"
        i = user.args[1]
        pieces.append((user, (starts[i], starts[i] + sizes[i])))
    return pieces


def match(attention: torch.fx.Node) -> list[tuple[torch.fx.Node, tuple[int, int], torch.fx.Node]] | str:
    """Per reader: (its FP8 GEMM, the sequence range it reads, the 2-D view it quantizes), or why not."""
    out = meta_value(attention)
    if any(static_int(size) is None for size in out.shape):
        return ("symbolic batch or sequence length (dynamic shapes): the rows each projection reads are not "
                "known at compile time")
    batch, heads, seq, head_dim = out.shape
    permutes = list(attention.users)
    if len(permutes) != 1 or not swaps_dims_1_and_2(permutes[0]):
        return "the output is read other than through the head-merging permute"
    readers: list[tuple[torch.fx.Node, tuple[int, int], torch.fx.Node]] = []
    for merged in permutes[0].users:
        if not (merged.target in RESHAPES and tuple(meta_value(merged).shape) == (batch, seq, heads * head_dim)):
            return "the heads are not merged into one (B, S, H·D) view"
        parts = _sequence_parts(merged, seq)
        if isinstance(parts, str):
            return parts
        for view, rows in parts:
            if view.target not in RESHAPES or tuple(meta_value(view).shape) != (batch * (rows[1] - rows[0]),
                                                                              heads * head_dim):
                return "the output is read in bf16 (not only through 2-D views that FP8 GEMMs quantize)"
            gemm = _quantizing_gemm(view)
            if isinstance(gemm, str):
                return gemm
            readers.append((gemm, rows, view))
    return readers or "the output is not read"


class FuseAttentionOutputQuant(Fp8Pass):
    name = "fuse-attention-output-quant"
    why = ("the attention kernel writes its output in FP8 with a scale bounding every row, for the FP8 projections "
           "after it: no separate quantize kernel reads the output back")
    default_config = Fp8Config(attention=True)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for attention, readers in accepted_matches(graph, torch.ops.kopt.fp8_attention.default, match, ctx, RULE):
            batch, heads, seq, head_dim = meta_value(attention).shape
            with graph.inserting_before(attention):  # reads only what the attention reads
                fused = graph.call_function(torch.ops.kopt.fp8_attention_quant.default, attention.args,
                                            dict(attention.kwargs))
                values = graph.call_function(operator.getitem, (fused, 0))
                scales = graph.call_function(operator.getitem, (fused, 1))
                merged = graph.call_function(aten.permute.default, (values, _HEAD_MERGE))
                merged = graph.call_function(aten.reshape.default, (merged, [batch, seq, heads * head_dim]))
            fake = meta_value(attention)
            fused.meta["val"] = (kernel.attention.empty_output(fake, FP8),
                                 fake.new_empty((batch, seq), dtype=torch.float32))
            new = [fused, values, scales, merged]
            for gemm, (start, end), _ in readers:
                with graph.inserting_before(gemm):
                    rows, row_scales = merged, scales
                    if (start, end) != (0, seq):
                        rows = graph.call_function(aten.slice.Tensor, (merged, 1, start, end))
                        row_scales = graph.call_function(aten.slice.Tensor, (scales, 1, start, end))
                        new += [rows, row_scales]
                    m = batch * (end - start)
                    a = graph.call_function(aten.reshape.default, (rows, [m, heads * head_dim]))
                    # (M, 1) row scales, contiguous as _scaled_mm wants them: a view for B = 1 or the whole
                    # sequence, else reshape copies the (B, rows) slice
                    s = graph.call_function(aten.reshape.default, (row_scales, [m, 1]))
                    new += [a, s]
                gemm.replace_input_with(gemm.args[0], a)
                gemm.replace_input_with(gemm.args[2], s)
            for node in new:
                stamp(node, pass_name=self.name, rule=RULE)
        graph.eliminate_dead_code()
