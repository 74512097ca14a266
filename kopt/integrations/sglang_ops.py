"""SGLang's fused norm / modulation ops, expanded into the ATen chains kopt's passes match.

SGLang's DiT layers (``LayerNormScaleShift`` and friends) call opaque custom ops: on CUDA
``sglang::fused_norm_scale_shift`` (a CuTe DSL kernel, ``forward_cuda``); on CPU its AMX build's
``sgl_kernel::fused_scale_shift_cpu`` (after a separate layer norm). A compiled graph then holds an
op kopt cannot see into, so its adaLN, gated-residual and FP8-quantize fusions never fire there.
This pass, first in the pipeline kopt's SGLang plugin uses, rewrites each op it understands into
the computation SGLang documents for it, which kopt's own fusions then take over:

    sglang.fused_norm_scale_shift(x, w, b, scale, shift, "layer"|"rms", eps)
        → norm(x; w, b, eps) * (1 + scale) + shift          (the op's docstring; forward_native)
    sgl_kernel.fused_scale_shift_cpu(y, scale, shift, c) → y * (c + scale) + shift
                                                             (SGLang's fuse_scale_shift_kernel_native)

with a (B, D) scale or shift viewed as (B, 1, D), and a scale or shift that SGLang expanded to the full
(B, S, D) before the call read from before that ``expand`` (the op broadcasts; so does the chain).
Declined (kept opaque, with the reason in the report): per-frame (B, F, 1, D) modulation, a norm type
other than "layer"/"rms", and every other ``sglang::`` / ``sgl_kernel::`` op, which the report lists
by name. Contract: tolerance, like the
fusions that follow: the ATen chain rounds where SGLang's fused kernel does not.
"""

from __future__ import annotations

import collections
import operator

import torch

from kopt.fx.graph_utils import meta_value, replace
from kopt.passes.base import Contract, Pass, PassContext

aten = torch.ops.aten
NORM_SCALE_SHIFT = "sglang.fused_norm_scale_shift.default"
SCALE_SHIFT_CPU = "sgl_kernel.fused_scale_shift_cpu.default"
FOREIGN_NAMESPACES = ("sglang.", "sgl_kernel.")


def _name(node: torch.fx.Node) -> str:
    return str(node.target) if node.op == "call_function" else ""


class ExpandSglangOps(Pass):
    name = "expand-sglang-ops"
    why = "SGLang's opaque norm/modulation ops become the ATen chains kopt's fusions rewrite"
    contract = Contract.tolerance(1e-2)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        graph = graph_module.graph
        unknown: collections.Counter[str] = collections.Counter()
        for node in list(graph.nodes):
            name = _name(node)
            if name == NORM_SCALE_SHIFT:
                self._norm_scale_shift(graph, node, ctx)
            elif name == SCALE_SHIFT_CPU:
                self._scale_shift(graph, node, ctx)
            elif name.startswith(FOREIGN_NAMESPACES):
                unknown[name] += 1
                ctx.decline("sglang-op", node, f"{name}: an SGLang op kopt has no expansion for; left opaque")
        graph.eliminate_dead_code()
        if unknown:
            ctx.notes.append("opaque SGLang ops left in the graph: "
                             + ", ".join(f"{name} ×{count}" for name, count in sorted(unknown.items())))

    def _modulation(self, graph: torch.fx.Graph, value: object, x: torch.Tensor,
                    node: torch.fx.Node) -> object | str:
        """``value`` broadcastable against the (B, S, D) ``x`` ((B, D) viewed as (B, 1, D)), or why not."""
        if not isinstance(value, torch.fx.Node):
            return value
        while value.target is aten.expand.default and isinstance(value.args[0], torch.fx.Node):
            value = value.args[0]  # broadcasting is the op's own semantics: the unexpanded value says the same
        shape = tuple(meta_value(value).shape) if meta_value(value) is not None else None
        width = x.shape[-1]
        if shape is None:
            return "modulation without shape metadata"
        if len(shape) == 4:
            return f"per-frame modulation {shape} (video layout) is not expanded"
        if len(shape) == 2 and shape[0] != 1:
            with graph.inserting_before(node):
                return graph.call_function(aten.unsqueeze.default, (value, 1))
        if shape[-1:] != (width,) and shape != (1,):
            return f"modulation of shape {shape} does not broadcast over width {width}"
        return value

    def _modulate(self, graph: torch.fx.Graph, node: torch.fx.Node, y: torch.fx.Node, x: torch.Tensor,
                  scale: object, shift: object, constant: float, ctx: PassContext, rule: str) -> None:
        parts = [self._modulation(graph, v, x, node) for v in (scale, shift)]
        reasons = [p for p in parts if isinstance(p, str)]
        if reasons:
            ctx.decline(rule, node, reasons[0])
            return
        if not ctx.fire(rule, node):
            return
        scale, shift = parts
        with graph.inserting_before(node):
            factor = graph.call_function(aten.add.Tensor, (scale, constant))
            scaled = graph.call_function(aten.mul.Tensor, (y, factor))
            out = graph.call_function(aten.add.Tensor, (scaled, shift))
        replace(node, out, pass_name=self.name, rule=rule)

    def _scale_shift(self, graph: torch.fx.Graph, node: torch.fx.Node, ctx: PassContext) -> None:
        y, scale, shift, constant = node.args[:4]
        x = meta_value(y)
        if x is None or x.dim() != 3:
            ctx.decline("scale-shift", node, "input is not (batch, tokens, width)")
            return
        self._modulate(graph, node, y, x, scale, shift, float(constant), ctx, "scale-shift")

    def _norm_scale_shift(self, graph: torch.fx.Graph, node: torch.fx.Node, ctx: PassContext) -> None:
        x_node, weight, bias, scale, shift, norm_type = node.args[:6]
        eps = node.args[6] if len(node.args) > 6 else node.kwargs.get("eps", 1e-5)
        x = meta_value(x_node)
        if x is None or x.dim() != 3:
            ctx.decline("norm-scale-shift", node, "input is not (batch, tokens, width)")
            return
        if norm_type not in ("layer", "rms"):
            ctx.decline("norm-scale-shift", node, f"norm type {norm_type!r} is neither 'layer' nor 'rms'")
            return
        width = x.shape[-1]
        with graph.inserting_before(node):
            if norm_type == "layer":
                norm = graph.call_function(aten.native_layer_norm.default, (x_node, [width], weight, bias, eps))
                y = graph.call_function(operator.getitem, (norm, 0))
            else:
                y = graph.call_function(aten.rms_norm.default, (x_node, [width], weight, eps))
        self._modulate(graph, node, y, x, scale, shift, 1.0, ctx, "norm-scale-shift")
