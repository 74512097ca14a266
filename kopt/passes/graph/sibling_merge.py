"""Sibling-projection merge: linears that read the same tensor become one wider GEMM.

    q = x @ Wq.T + bq;  k = x @ Wk.T + bk;  v = x @ Wv.T + bv
  → qkv = x @ cat(Wq, Wk, Wv).T + cat(bq, bk, bv);  q, k, v = split(qkv, [nq, nk, nv], dim=-1)

Why it is valid: each output column of a GEMM depends only on its own weight row, so stacking the
weight rows computes the same columns. Why it pays: x is read once instead of once per sibling,
and one large GEMM fills the GPU better than several narrow ones (Q/K/V of every attention, and
in Qwen-Image the image and text modulation GEMMs of every block, which all read the timestep
embedding). Contract: tolerance — the wider GEMM may pick another kernel (tiling, split-K) and
round differently; the values are mathematically equal. Weights are concatenated once at compile
time and recorded as a stacked derivation (:mod:`kopt.fx.derived`): the module's weights then become
views of their rows (:mod:`kopt.fx.shared_weights`, one copy of the bytes instead of two), and a
sibling's weight given new storage is concatenated again.
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import torch

from kopt.fx.constants import constant_value, transposed_constant, weight_of, weight_paths
from kopt.fx.derived import derive
from kopt.fx.graph_utils import replace, stamp
from kopt.fx.shared_weights import adjacent_rows
from kopt.passes.base import Contract, Pass, PassContext

aten = torch.ops.aten
RULE = "merge-siblings"


@dataclasses.dataclass
class Linear:
    """One ``x @ W.T (+ b)`` GEMM node, with constant ``W`` and optional constant ``b``."""

    node: torch.fx.Node
    weight: torch.Tensor
    bias: torch.Tensor | None


def as_linear(node: torch.fx.Node) -> Linear | str:
    """The linear behind a GEMM node, or the reason it is not one with constant weights."""
    if node.target is aten.mm.default:
        weight_t = node.args[1]
        bias = None
    elif node.target is aten.addmm.default:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return "addmm with alpha/beta other than 1"
        bias_node, weight_t = node.args[0], node.args[2]
        bias = constant_value(bias_node)
        if bias is None or bias.dim() != 1:
            return "bias is not a 1-D constant"
    else:
        return "not a GEMM"
    weight_node = transposed_constant(weight_t)
    if weight_node is None:
        return "weight is not a constant (activation × activation product)"
    return Linear(node, constant_value(weight_node), bias)  # type: ignore[arg-type]


def concatenate(*weights: torch.Tensor) -> torch.Tensor:
    """The siblings' weights (or biases) stacked along the output dimension; without a copy when
    they already are consecutive rows of one tensor (a module whose weights were shared with an
    earlier compilation's merged weight, compiled again for new shapes)."""
    joined = adjacent_rows(weights)
    return joined if joined is not None else torch.cat(weights)


def concatenate_biases(layout: tuple[int | None, ...], *biases: torch.Tensor) -> torch.Tensor:
    """The siblings' biases stacked, zeros of the given width where a sibling has none (None: it has one)."""
    present = iter(biases)
    return torch.cat([next(present) if width is None else biases[0].new_zeros(width) for width in layout])


class SiblingProjectionMerge(Pass):
    name = "sibling-merge"
    why = "linears reading the same tensor share one GEMM on concatenated weights (x read once)"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        extra_bytes = 0
        for source in list(graph_module.graph.nodes):
            gemms = [u for u in source.users if u.target in (aten.mm.default, aten.addmm.default)
                     and (u.args[1] if u.target is aten.addmm.default else u.args[0]) is source]
            if len(gemms) < 2:
                continue
            siblings = []
            for gemm in gemms:
                linear = as_linear(gemm)
                if isinstance(linear, str):
                    ctx.decline(RULE, gemm, linear)
                else:
                    siblings.append(linear)
            groups: dict[tuple[torch.dtype, torch.device], list[Linear]] = {}
            for linear in siblings:
                groups.setdefault((linear.weight.dtype, linear.weight.device), []).append(linear)
            for group in groups.values():
                if len(group) >= 2 and ctx.fire(RULE, group[0].node):
                    extra_bytes += self._merge(graph_module, source, group)
        graph_module.graph.eliminate_dead_code()  # the per-sibling weight transposes
        if extra_bytes:
            ctx.notes.append(f"concatenated weights hold {extra_bytes / 2**20:.1f} MiB (the module's weights "
                             "become views of them unless share_weights=False)")

    def _merge(self, graph_module: torch.fx.GraphModule, source: torch.fx.Node, group: list[Linear]) -> int:
        graph = graph_module.graph
        order = {node: i for i, node in enumerate(graph.nodes)}
        group.sort(key=lambda linear: order[linear.node])
        first = group[0].node
        weight_nodes = [weight_of(linear.node) for linear in group]
        weight_node = derive(graph_module, "_kopt_merged_weight", concatenate, weight_nodes, first, stacked=True)
        # the merged weight answers to every sibling's parameter path (fp8 include/skip select by path)
        weight_node.meta["kopt_params"] = tuple(path for node in weight_nodes for path in weight_paths(node))
        bias_node = None
        if any(linear.bias is not None for linear in group):
            layout = tuple(None if linear.bias is not None else linear.weight.shape[0] for linear in group)
            biases = [linear.node.args[0] for linear in group if linear.bias is not None]
            if all(width is None for width in layout):
                bias_node = derive(graph_module, "_kopt_merged_bias", concatenate, biases, first, stacked=True)
            else:
                bias_node = derive(graph_module, "_kopt_merged_bias", functools.partial(concatenate_biases, layout),
                                   biases, first)
        weight, bias = constant_value(weight_node), constant_value(bias_node)
        sizes = [linear.weight.shape[0] for linear in group]
        with graph.inserting_before(first):
            weight_t = graph.call_function(aten.t.default, (weight_node,))
            if bias_node is not None:
                merged = graph.call_function(aten.addmm.default, (bias_node, source, weight_t))
            else:
                merged = graph.call_function(aten.mm.default, (source, weight_t))
            parts = graph.call_function(aten.split_with_sizes.default, (merged, sizes, 1))
            for node in (weight_t, merged, parts):
                stamp(node, pass_name=self.name, rule=RULE)
            for index, linear in enumerate(group):
                piece = graph.call_function(operator.getitem, (parts, index))
                replace(linear.node, piece, pass_name=self.name, rule=RULE)
        for linear in group:  # only now: `first` was the insertion point until here
            graph.erase_node(linear.node)
        return weight.numel() * weight.element_size() + (0 if bias is None else bias.numel() * bias.element_size())

