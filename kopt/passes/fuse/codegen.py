"""Generate a kernel for each maximal elementwise region (with at most one last-dim reduction).

    v1 = f1(inputs); v2 = f2(v1, ...); ... (≥ 2 aten elementwise ops, ≤ 1 row reduction)
  → (o1, o2, ...) = kopt.gen_<key>(inputs)     one Triton kernel, generated and cached

Valid because :func:`kopt.codegen.build_region` accepts the region (every op in the vocabulary,
one row shape, the reduction over the last dim, no path out of the region and back in), and the
generated op computes each output of the region from the same inputs. Regions are found by
:func:`kopt.codegen.find_regions`; nodes that are already kopt ops are never part of one. Contract:
tolerance — the kernel computes in float32 and rounds once per output, where a bf16/fp16 graph
rounds after every op (a few ulps of the output dtype apart; fp32 graphs agree to ~1e-6).
Near misses name what kept a node out (a second reduction, a reduction over another dim, ...).
"""

from __future__ import annotations

import operator

import torch

from kopt.codegen import compile_region, find_regions
from kopt.fx.graph_utils import stamp
from kopt.passes.base import Contract, Pass, PassContext

RULE = "codegen-region"


class CodegenFuse(Pass):
    name = "codegen-fuse"
    why = "an elementwise chain (and its row reduction) reads its inputs and writes its outputs once, in one kernel"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        search = find_regions(graph)
        for node, reason in search.refusals.items():
            ctx.decline(RULE, node, reason)
        replaced: dict[torch.fx.Node, torch.fx.Node] = {}  # outputs of regions already rewritten
        for region in search.regions:
            if not ctx.fire(RULE, region.output_nodes[-1]):
                continue
            generated = compile_region(region, trace_dir=ctx.trace_dir)
            members = set(region.members)
            order = {n: i for i, n in enumerate(graph.nodes)}
            first_reader = min((u for out in region.output_nodes for u in out.users if u not in members),
                               key=order.__getitem__)
            with graph.inserting_before(first_reader):
                fused = graph.call_function(generated.op, tuple(replaced.get(n, n) for n in region.input_nodes))
                values = [out.meta["val"] for out in region.output_nodes]
                fused.meta["val"] = values[0] if len(values) == 1 else tuple(values)
                stamp(fused, pass_name=self.name, rule=RULE)
                results = [fused] if len(values) == 1 else [
                    graph.call_function(operator.getitem, (fused, k)) for k in range(len(values))]
            for out, result in zip(region.output_nodes, results, strict=True):
                result.meta["val"] = out.meta["val"]
                for key in ("stack_trace", "nn_module_stack"):
                    if key in out.meta:
                        result.meta.setdefault(key, out.meta[key])
                out.replace_all_uses_with(result, delete_user_cb=lambda user, inside=members: user not in inside)
                replaced[out] = result
            for node in reversed(region.members):
                graph.erase_node(node)
            ctx.notes.append(f"{generated.name}: {len(region.steps)} nodes → 1 op "
                             f"({', '.join(o.node for o in region.outputs)})")
