"""Joint attention input: ``cat([qk_norm_rope(x_txt), qk_norm_rope(x_img)], dim=1)`` → one op.

Qwen-Image's dual-stream attention normalizes and rotates the text and the image Q and K
separately (``fuse-qk-norm-rope`` turns each into one ``kopt::qk_norm_rope``) and then
concatenates them along the sequence for one attention call. The concatenation reads and writes
the whole Q (K) tensor once more. ``kopt::qk_norm_rope_joint`` runs the same per-stream kernels
but writes each stream's rows into its slice of the joint buffer, so the copy disappears.

Valid when every input of a sequence-dim cat is a ``kopt::qk_norm_rope`` of one mode whose only
user is that cat: then the joint op computes exactly the same values (same kernel, same tables,
same eps per stream) and nothing else reads the per-stream results. Contract: exact.
Run it after ``fuse-qk-norm-rope``; FLUX.2's real form gets its joint op from
``fuse-qk-norm-rope-real`` directly.
"""

from __future__ import annotations

import torch

from kopt.fx.graph_utils import meta_value, replace
from kopt.kernels import joint_qk_norm_rope as _registers_joint  # noqa: F401  (torch.ops.kopt.qk_norm_rope_joint)
from kopt.kernels import qk_norm_rope as _registers_the_op  # noqa: F401  (torch.ops.kopt.qk_norm_rope)
from kopt.passes.base import Contract, Pass, PassContext, accepted_matches

aten = torch.ops.aten
RULE = "joint-qk-norm-rope"


def joins_a_rope(cat: torch.fx.Node) -> bool:
    """Only cats with a qk_norm_rope among their inputs are candidates (and near misses)."""
    parts = cat.args[0]
    return isinstance(parts, (list, tuple)) and any(
        isinstance(p, torch.fx.Node) and p.target is torch.ops.kopt.qk_norm_rope.default for p in parts)


def match(cat: torch.fx.Node) -> list[torch.fx.Node] | str | None:
    """The per-stream qk_norm_rope nodes the cat joins, or why the cat is not a joint input."""
    if not joins_a_rope(cat):
        return None
    parts = cat.args[0]
    cat_val = meta_value(cat)
    if cat_val is None or cat_val.dim() != 4:
        return "not a cat of (B, S, H, D) tensors"
    dim = cat.args[1] if len(cat.args) > 1 else 0
    if dim not in (1, -3):
        return "a cat along other than the sequence dim"
    if len(parts) < 2:
        return "a cat of one tensor"
    if not all(isinstance(p, torch.fx.Node) and p.target is torch.ops.kopt.qk_norm_rope.default for p in parts):
        return "not every joined stream is a kopt::qk_norm_rope"
    if len({p.args[5] for p in parts}) != 1:
        return "the streams use different RoPE forms"
    if any(len(p.users) != 1 for p in parts):
        return "a per-stream result has other users than the cat: the joint op would compute it twice"
    return list(parts)


class FuseJointAttentionInput(Pass):
    name = "fuse-joint-attention-input"
    why = "text and image Q/K written by their norm+RoPE kernels straight into the joint attention buffer"
    contract = Contract.exact()

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        for cat, parts in accepted_matches(graph, aten.cat.default, match, ctx, RULE):
            columns = list(zip(*(p.args for p in parts), strict=True))  # x, weight, cos, sin, eps, mode
            with graph.inserting_before(cat):
                fused = graph.call_function(torch.ops.kopt.qk_norm_rope_joint.default,
                                            (list(columns[0]), list(columns[1]), list(columns[2]),
                                             list(columns[3]), list(columns[4]), columns[5][0]))
            replace(cat, fused, pass_name=self.name, rule=RULE)
        graph.eliminate_dead_code()
