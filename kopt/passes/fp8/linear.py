"""FP8 linears: ``x @ W.T (+ b)`` with constant ``W`` becomes one FP8 GEMM, ``W`` quantized once.

    y = addmm(b, x, W.T)                  (or mm(x, W.T); or bmm(x, W.T.expand(B, K, N)) of a 3-D x, flattened)
  → y = _scaled_mm(quant(x), W8.T, scale_x, scale_W, bias=b, out_dtype=x.dtype)       (tensor, row)
  → y = kopt.fp8_block_mm(quant(x), scale_x, W8, scale_W, b, x.dtype)                 (block granularities)

``W8`` and ``scale_W`` are computed here, at compile time, from the frozen weight (the same
constant folding the staging pass does, done by this pass so that no pipeline order can leave a
weight quantized per call); a merged sibling weight is quantized once as a whole, and the bf16
copy sibling-merge made is dropped. The activation is quantized on every call, per row (token) or
per tensor: those few elementwise ops and one row reduction are what Inductor fuses into the
producer's kernel. The bias rides in the GEMM epilogue, so no standalone bias add remains (the
block-scaled GEMM has no bias epilogue: there the add follows it). Block granularities scale each
1×128 slice of an activation row, and each 1×128 or 128×128 weight tile (:mod:`kopt.passes.fp8.block_mm`);
their weight scale grids are put in the memory order the GPU's GEMM reads, here, once.

Valid because ``_scaled_mm`` computes ``(q_x * scale_x) @ (q_W * scale_W).T + b`` with float32
accumulation, i.e. the linear on the quantized values; the loss is the quantization error itself,
so the contract is ``quality``: the gate of :class:`kopt.fp8.Fp8Config` (cosine and SQNR against
bf16, checked by ``verify=True`` and by :func:`kopt.fp8.measure`). With ``fast_accum`` (the
default) the tensor cores keep their partial sums in their own, slightly shorter, accumulator
format, which the same gate covers; a GPU whose ``_scaled_mm`` refuses it is probed once and
falls back to float32 accumulation, with a note.
"""

from __future__ import annotations

import functools

import torch

from kopt.fp8.config import Fp8Config, Granularity
from kopt.fp8.quantize import BLOCK, FP8, FP8_MAX, MIN_AMAX, Operand, block_shape, quantize
from kopt.fx.constants import (
    constant_value,
    drop_unused_constants,
    transposed_constant,
    weight_of,
    weight_paths,
)
from kopt.fx.derived import derive
from kopt.fx.graph_utils import meta_value, replace, size_arg, stamp
from kopt.fx.symbolic import static_int
from kopt.passes.base import PassContext
from kopt.passes.fp8 import block_mm
from kopt.passes.fp8.base import Fp8Pass

aten = torch.ops.aten
RULE = "fp8-linear"
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def quantize_weight(granularity: Granularity, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``W8`` and ``scale_W`` of a weight, the scales laid out as the GEMM reads them."""
    q_weight, w_scale = quantize(weight, granularity, Operand.WEIGHT)
    weight_block = block_shape(granularity, Operand.WEIGHT)
    if granularity is Granularity.ROW:
        w_scale = w_scale.t().contiguous()  # (1, OUT): one scale per output column of the GEMM
    elif weight_block is not None:
        w_scale = block_mm.pack_weight_scale(w_scale, weight_block[0])
    return q_weight, w_scale


def activation_of(node: torch.fx.Node) -> torch.fx.Node:
    """The activation operand of a linear's GEMM node (``mm``, ``addmm`` or ``bmm``)."""
    return node.args[1] if node.target is aten.addmm.default else node.args[0]


def _batched_weight(node: torch.fx.Node) -> torch.fx.Node | None:
    """``W`` of ``bmm(x, W.T.expand(B, K, N))``: a linear without bias applied to a (B, S, K)
    activation that its decomposition could not flatten to 2-D (e.g. a slice of a permuted
    attention output, FLUX.2's output projections)."""
    operand = node.args[1] if node.target is aten.bmm.default else None
    if not (isinstance(operand, torch.fx.Node) and operand.target is aten.expand.default):
        return None
    return transposed_constant(operand.args[0])


def match(node: torch.fx.Node, config: Fp8Config) -> torch.fx.Node | str | None:
    """The constant weight node of a linear ``config`` selects, the reason it is declined, or None
    for GEMMs that are not linears at all (activation × activation products: not candidates)."""
    weight = weight_of(node) if node.target is not aten.bmm.default else _batched_weight(node)
    if weight is None:
        return None
    if node.target is aten.addmm.default:
        if node.kwargs:
            return "addmm with alpha/beta: not a plain linear"
        bias = constant_value(node.args[0])
        if bias is None or bias.dim() != 1:
            return "the bias is not a 1-D constant"
    paths = weight_paths(weight)
    reasons = [config.selects(path) for path in paths] if paths else [config.selects(None)]
    declined = [r for r in reasons if r]
    if declined:
        return declined[0] + (" (a merged sibling: all or none are quantized)" if len(paths) > 1 else "")
    value = constant_value(weight)
    x = meta_value(activation_of(node))
    if value.dim() != 2 or min(value.shape) < config.min_features:
        return f"{tuple(value.shape)} weight is smaller than min_features={config.min_features}"
    if x is None or x.dtype not in _FLOATS or value.dtype not in _FLOATS:
        return "not a floating-point linear"
    if value.shape[1] % 16 or value.shape[0] % 16:
        return f"{tuple(value.shape)} weight: FP8 GEMMs need both dims divisible by 16"
    block = block_shape(Granularity(config.granularity), Operand.WEIGHT)
    if block and (value.shape[1] % BLOCK or value.shape[0] % BLOCK):
        return f"{tuple(value.shape)} weight: block-scaled GEMMs need both dims divisible by {BLOCK}"
    if block and value.is_cuda and static_int(x.numel() // x.shape[-1]) is None:
        return "symbolic number of rows: cuBLAS' block-scaled GEMM is checked per shape on the GPU"
    if block and value.is_cuda:
        refused = block_mm.cuda_shape_check(value.device.index or 0, x.numel() // x.shape[-1], value.shape[1],
                                            value.shape[0], block[0])
        if refused:
            return refused
    return weight


def _quantize_activation(graph: torch.fx.Graph, x: torch.fx.Node, granularity: Granularity
                         ) -> tuple[torch.fx.Node, torch.fx.Node]:
    """Nodes for :func:`kopt.fp8.quantize.quantize` of a per-call activation (the same math)."""
    call = graph.call_function
    xf = call(aten._to_copy.default, (x,), {"dtype": torch.float32})
    if block_shape(granularity, Operand.ACTIVATION) is not None:
        return _quantize_activation_blocks(graph, xf, meta_value(x).shape[-1])
    magnitude = call(aten.abs.default, (xf,))
    if granularity is Granularity.ROW:
        amax = call(aten.amax.default, (magnitude, [-1], True))
    else:
        amax = call(aten.amax.default, (magnitude, [0, 1]))
    scale = _scale_node(graph, amax)
    return _cast_node(graph, xf, scale), scale


def _scale_node(graph: torch.fx.Graph, amax: torch.fx.Node) -> torch.fx.Node:
    """``max(amax, 1e-12) / 448``: the scale :func:`kopt.fp8.quantize.quantize` gives a group."""
    call = graph.call_function
    return call(aten.div.Tensor, (call(aten.clamp_min.default, (amax, MIN_AMAX)), FP8_MAX))


def _cast_node(graph: torch.fx.Graph, values: torch.fx.Node, scale: torch.fx.Node) -> torch.fx.Node:
    """``clamp(values / scale, ±448)`` cast to float8_e4m3fn (the node chain fuse-activation-quant matches)."""
    call = graph.call_function
    clamped = call(aten.clamp.default, (call(aten.div.Tensor, (values, scale)), -FP8_MAX, FP8_MAX))
    return call(aten._to_copy.default, (clamped,), {"dtype": FP8})


def _quantize_activation_blocks(graph: torch.fx.Graph, xf: torch.fx.Node, cols: int
                                ) -> tuple[torch.fx.Node, torch.fx.Node]:
    """1×128 blocks of the (M, K) float32 activation: q (M, K) and scales (M, K/128), the scales
    computed as (K/128, M) and viewed transposed, i.e. column-major, the order Hopper's
    block-scaled GEMM reads (so that no call re-packs them). M is left to the reshape (-1): it may
    be a symbolic size; K is the constant weight's."""
    call = graph.call_function
    rows = -1
    tiles = call(aten.reshape.default, (xf, [rows, cols // BLOCK, BLOCK]))
    by_block = call(aten.permute.default, (call(aten.abs.default, (tiles,)), [1, 0, 2]))
    amax = call(aten.amax.default, (by_block, [-1]))  # (K/128, M)
    scale = call(aten.t.default, (_scale_node(graph, amax),))  # (M, K/128), column-major
    per_tile = call(aten.unsqueeze.default, (scale, -1))
    q = call(aten.reshape.default, (_cast_node(graph, tiles, per_tile), [rows, cols]))
    return q, scale


def _device(graph_module: torch.fx.GraphModule) -> torch.device:
    """The device of the graph's constants (the weights the GEMMs read)."""
    for value in list(graph_module.parameters()) + list(graph_module.buffers()):
        return value.device
    return torch.device("cpu")


@functools.cache
def _fast_accum_refused(device: torch.device) -> str | None:
    """Why ``_scaled_mm(use_fast_accum=True)`` with row scales and a bf16 bias fails on ``device``, or None."""
    try:
        a = torch.ones(32, 32, device=device).to(FP8)
        torch._scaled_mm(a, a.t(), torch.ones(32, 1, device=device), torch.ones(1, 32, device=device),
                         bias=torch.zeros(32, device=device, dtype=torch.bfloat16), out_dtype=torch.bfloat16,
                         use_fast_accum=True)
    except Exception as error:  # noqa: BLE001 - any refusal means: accumulate in float32
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def _fast_accum_runs(device: torch.device, granularity: Granularity, ctx: PassContext) -> bool:
    """Whether the GEMMs get ``use_fast_accum``: row or tensor scales, and the device's ``_scaled_mm`` takes it."""
    if block_shape(granularity, Operand.WEIGHT) is not None:
        return False  # block scales run on kopt::fp8_block_mm
    refused = _fast_accum_refused(device)
    if refused:
        ctx.notes.append(f"fast FP8 accumulation refused on {device} ({refused}): GEMMs accumulate in float32")
    return refused is None


class Fp8Linear(Fp8Pass):
    name = "fp8-linear"
    why = "linears with constant weights run as FP8 GEMMs; weights and their scales quantized once at compile time"

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        granularity = Granularity(self.config.granularity)
        weight_bytes = 0
        fast_accum = self.config.fast_accum and _fast_accum_runs(_device(graph_module), granularity, ctx)
        for node in list(graph.nodes):
            if node.target not in (aten.mm.default, aten.addmm.default, aten.bmm.default):
                continue
            found = match(node, self.config)
            if found is None:
                continue
            if isinstance(found, str):
                ctx.decline(RULE, node, found)
                continue
            if not ctx.fire(RULE, node):
                continue
            weight_block = block_shape(granularity, Operand.WEIGHT)
            q_node, scale_node = derive(graph_module, ("_kopt_fp8_weight", "_kopt_fp8_scale"),
                                        functools.partial(quantize_weight, granularity), [found], node)
            q_weight, w_scale = constant_value(q_node), constant_value(scale_node)
            weight_bytes += q_weight.numel() + w_scale.numel() * 4
            bias = node.args[0] if node.target is aten.addmm.default else None
            out_dtype = meta_value(node).dtype
            with graph.inserting_before(node):
                x = activation_of(node)
                batched = None
                if node.target is aten.bmm.default:  # (B, S) of the activation, as ints or sym_size nodes
                    batched = [size_arg(graph, x, 0), size_arg(graph, x, 1)]
                    # (B, S, K) -> (B·S, K): a copy only if the view cannot be flattened
                    x = graph.call_function(aten.reshape.default, (x, [-1, meta_value(x).shape[2]]))
                q_x, x_scale = _quantize_activation(graph, x, granularity)
                if weight_block is not None:
                    mat2 = q_node
                    gemm = graph.call_function(torch.ops.kopt.fp8_block_mm.default,
                                               (q_x, x_scale, q_node, scale_node, bias, out_dtype, weight_block[0]))
                else:
                    mat2 = graph.call_function(aten.t.default, (q_node,))
                    # torch's CUDA _scaled_mm has no bias epilogue for float32 outputs: add it after
                    epilogue_bias = None if out_dtype == torch.float32 else bias
                    kwargs = {"bias": epilogue_bias, "out_dtype": out_dtype}
                    if fast_accum:
                        kwargs["use_fast_accum"] = True
                    gemm = graph.call_function(aten._scaled_mm.default, (q_x, mat2, x_scale, scale_node), kwargs)
                    if bias is not None and epilogue_bias is None:
                        gemm = graph.call_function(aten.add.Tensor, (gemm, bias))
                if batched is not None:
                    gemm = graph.call_function(aten.reshape.default, (gemm, [*batched, q_weight.shape[0]]))
            for new in (q_x, x_scale, mat2):
                stamp(new, pass_name=self.name, rule=RULE)
            replace(node, gemm, pass_name=self.name, rule=RULE)
            graph.erase_node(node)
        graph.eliminate_dead_code()
        freed = drop_unused_constants(graph_module)
        if weight_bytes:
            ctx.notes.append(f"FP8 weights and scales hold {weight_bytes / 2**20:.1f} MiB ({granularity.value} "
                             f"scales), quantized at compile time"
                             + (f"; dropped {freed / 2**20:.1f} MiB of merged bf16 weights" if freed else ""))
