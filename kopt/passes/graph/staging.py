"""Binding-time staging: fold what is constant, hoist and memoize what is step-invariant.

Constant subgraphs (RoPE tables built from shapes, casts of weights, anything computed from
weights alone) are evaluated once here and become constants. Step-invariant subgraphs (timestep
embedding, the modulation GEMMs of every block, position tables built from position ids) are
marked for hoisting: at lowering, kopt splits them into a graph of their own that runs only when
the *values* of its inputs change (both CFG calls of a step share one evaluation) — see
:mod:`kopt.fx.staged_program`. Valid because binding times are sound (a pure function of
unchanged values is unchanged) and the memo compares input values byte for byte. Exact: the same
ops run on the same values, only less often.
"""

from __future__ import annotations

import functools

import torch

from kopt.config import Role
from kopt.fx.binding_time import binding_times, is_view
from kopt.fx.constants import constant_value
from kopt.fx.derived import derive, subgraph_computation
from kopt.fx.graph_utils import replace
from kopt.fx.symbolic import static_int
from kopt.passes.base import Contract, Pass, PassContext

HOIST_KEY = "kopt_hoist"  # graph_module.meta entry: names of the values the hoisted stage returns
HOIST_COST_KEY = "kopt_hoist_cost"  # graph_module.meta entry: (GEMM FLOPs, bytes of constants) of that stage
MAX_FOLD_BYTES = 1 << 30  # a constant bigger than this is left to be computed per call


def needed_at_runtime(graph: torch.fx.Graph, times: dict[torch.fx.Node, Role], role: Role) -> set[torch.fx.Node]:
    """Nodes of binding time ``role`` whose value later-bound nodes (or the output) read, directly
    or through views of the same binding time (the views themselves stay in the later stage)."""
    needed: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if times.get(node) is not role:
            continue
        for user in node.users:
            later = user.op == "output" or times.get(user) is not role
            if later or (is_view(user) and user in needed):
                needed.add(node)
                break
    return needed


def gemm_flops(node: torch.fx.Node) -> int:
    """2·M·N·K for an mm/addmm node with static shape metadata, else 0 (for the report only: a
    symbolic size is not turned into a number, which would add a guard)."""
    if node.target not in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return 0
    out = node.meta.get("val")
    a = node.args[0 if node.target is torch.ops.aten.mm.default else 1]
    a_val = getattr(a, "meta", {}).get("val")
    if out is None or a_val is None:
        return 0
    sizes = [static_int(d) for d in (out.shape[0], out.shape[1], a_val.shape[1])]
    return 0 if None in sizes else 2 * sizes[0] * sizes[1] * sizes[2]


def _folded(computation: torch.fx.GraphModule, *constants: torch.Tensor) -> torch.Tensor:
    """A folded constant's value, in storage of its own (a small slice must not keep a large
    intermediate alive)."""
    value = computation(*constants)
    if value.untyped_storage().nbytes() > value.numel() * value.element_size():
        value = value.clone()
    return value


class BindingTimeStaging(Pass):
    name = "staging"
    why = "constants are computed once at compile time; step-invariant work once per timestep value"
    contract = Contract.exact()

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        self._fold_constants(graph_module, ctx)
        self._mark_hoisted(graph_module, ctx)

    def _fold_constants(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        times = binding_times(graph)
        candidates = [n for n in needed_at_runtime(graph, times, Role.CONSTANT)
                      if n.op == "call_function" and not is_view(n)]
        folded_bytes = 0
        order = {node: i for i, node in enumerate(graph.nodes)}
        for node in sorted(candidates, key=order.__getitem__):
            value = node.meta.get("val")  # the fake value: what folding would produce, computed by nothing
            if not isinstance(value, torch.Tensor):
                ctx.decline("fold-constant", node, f"returns {type(value).__name__}, not one tensor")
                continue
            size = value.numel() * value.element_size()
            if size > MAX_FOLD_BYTES:
                ctx.decline("fold-constant", node, f"result is {size / 2**30:.1f} GiB: computed per call instead")
                continue
            if not ctx.fire("fold-constant", node):
                continue
            # recorded with its subgraph, so that a changed weight it reads is folded again
            computation, constants = subgraph_computation(node)
            constant = derive(graph_module, "_kopt_folded", functools.partial(_folded, computation), constants, node)
            replace(node, constant, pass_name=self.name, rule="fold-constant")
            folded_bytes += size
        graph.eliminate_dead_code()
        if folded_bytes:
            ctx.notes.append(f"folded constants hold {folded_bytes / 2**20:.2f} MiB")

    def _mark_hoisted(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        times = binding_times(graph)
        needed = needed_at_runtime(graph, times, Role.STEP_INVARIANT)
        frontier = [n for n in graph.nodes if n in needed and n.op == "call_function" and not is_view(n)]
        if not frontier:
            invariant_inputs = [n.name for n in graph.nodes
                                if n.op == "placeholder" and times.get(n) is Role.STEP_INVARIANT]
            if invariant_inputs:
                ctx.decline("hoist-step-invariant", invariant_inputs[0],
                            "step-invariant inputs feed only views or per-call work directly")
            return
        hoisted: set[torch.fx.Node] = set()
        stack = list(frontier)
        while stack:
            node = stack.pop()
            if node in hoisted or node.op == "placeholder":
                continue
            hoisted.add(node)
            stack.extend(node.all_input_nodes)
        if not ctx.fire("hoist-step-invariant", frontier[0]):
            return
        graph_module.meta[HOIST_KEY] = [n.name for n in frontier]
        keys = sorted({str(i.meta.get("kopt_source", i.name)) for n in hoisted for i in n.all_input_nodes
                       if i.op == "placeholder"})
        flops = sum(gemm_flops(n) for n in hoisted)
        weights = [constant_value(n) for n in hoisted if n.op == "get_attr"]
        weight_bytes = sum(w.numel() * w.element_size() for w in weights if w is not None)
        count = len([n for n in hoisted if n.op == "call_function"])
        graph_module.meta[HOIST_COST_KEY] = (flops, weight_bytes)
        ctx.notes.append(f"hoisted {count} step-invariant nodes ({flops / 1e6:,.1f} MFLOP of GEMMs reading "
                         f"{weight_bytes / 2**20:,.1f} MiB of constants, skipped on a memo hit) behind "
                         f"{len(frontier)} values, memoized on the values of {', '.join(keys)}")
