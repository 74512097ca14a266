"""The attention backend as a per-shape choice: rewrite a captured SDPA node to run on a named backend.

A captured graph holds attention as the backend op the dispatcher picked while tracing
(``aten._scaled_dot_product_flash_attention_for_cpu`` on the CPU, ``..._flash_attention``,
``..._efficient_attention`` or ``..._cudnn_attention`` on a GPU). :class:`SdpaBackendPass` replaces
such a node, where only its first output (the attention output) is read, by ``kopt_agent::sdpa``,
which calls :func:`torch.nn.functional.scaled_dot_product_attention` under
:func:`torch.nn.attention.sdpa_kernel` with the one backend chosen for that node's shape.

Why it is valid: every backend computes softmax(q kᵀ · scale + mask) v; they differ in tiling and
accumulation order (float32 accumulation in all), so the result is equal within rounding, which the
``sdpa-backend`` contract (tolerance 1e-2, the attention kernels' own) states. Grouped-query attention
(fewer key/value heads than query heads, as the captured fused ops take it) is passed on as such where
the backend takes it and with the key/value heads repeated where it does not. Nodes with dropout, or
whose log-sum-exp or other outputs are read, are left alone. The op has a fake implementation, so the
rewritten graph runs as FX and lowers with Inductor (an extern kernel call).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping

import torch

from kopt.passes.base import Contract, Pass, PassContext

NAME = "sdpa-backend"
CONTRACT = Contract.tolerance(1e-2)
BACKEND_OPS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
}
BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "cudnn": "CUDNN_ATTENTION"}
# Backends that take fewer key/value heads than query heads themselves (``enable_gqa``); for the others
# the key and value heads are repeated to the query's count first, which is the same attention.
GQA_BACKENDS = ("flash", "math")
# Which backends a device offers for a dense float attention (the proposer's choices).
DEVICE_BACKENDS = {"cpu": ("math", "flash"), "cuda": ("flash", "efficient", "cudnn", "math")}

_LIBRARY = torch.library.Library("kopt_agent", "FRAGMENT")
_LIBRARY.define("sdpa(Tensor q, Tensor k, Tensor v, Tensor? mask, bool is_causal, float? scale, str backend) -> Tensor")


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
          scale: float | None, backend: str) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    grouped = {}
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each key/value head serves several query heads
        if backend in GQA_BACKENDS:
            grouped = {"enable_gqa": True}
        else:
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    with sdpa_kernel([getattr(SDPBackend, BACKENDS[backend])]):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                               scale=scale, **grouped)
    laid_out = _sdpa_fake(q, k, v, mask, is_causal, scale, backend)
    if out.stride() == laid_out.stride():
        return out
    return laid_out.copy_(out)


def _sdpa_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
               scale: float | None, backend: str) -> torch.Tensor:
    """The layout the fused backends write: (batch, query, heads, value dim) in memory, so the graph's
    views after attention (written for that layout) stay valid."""
    return q.new_empty((q.shape[0], q.shape[2], q.shape[1], v.shape[-1])).transpose(1, 2)


_LIBRARY.impl("sdpa", _sdpa, "CompositeExplicitAutograd")
torch.library.register_fake("kopt_agent::sdpa", _sdpa_fake, lib=_LIBRARY)
SDPA_OP = torch.ops.kopt_agent.sdpa.default


def _arguments(node: torch.fx.Node) -> dict[str, object]:
    names = [a.name for a in node.target._schema.arguments]
    bound = dict(zip(names, node.args, strict=False))  # trailing defaults may be left out
    bound.update(node.kwargs)
    return bound


def attention_backend(node: torch.fx.Node) -> str | None:
    """The backend a captured attention node runs on, or None if it is not one."""
    packet = getattr(node.target, "overloadpacket", None)
    return BACKEND_OPS.get(packet.__name__) if node.op == "call_function" and packet is not None else None


def shape_key(node: torch.fx.Node) -> str:
    """The attention shape a choice is made for: query and key shapes and the dtype."""
    q, k = node.args[0].meta["val"], node.args[1].meta["val"]
    return f"q{list(q.shape)}k{list(k.shape)}{str(q.dtype).removeprefix('torch.')}"


def rewritable(node: torch.fx.Node) -> str:
    """Empty if ``node`` can take another backend, else why not."""
    if attention_backend(node) is None:
        return "not an attention node"
    if float(_arguments(node).get("dropout_p", 0.0) or 0.0) != 0.0:
        return "dropout"
    if any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in node.users):
        return "reads an output other than the attention output"
    if not any(u.args[1] == 0 for u in node.users):
        return "its output is not read"
    q, v, out = node.args[0].meta["val"], node.args[2].meta["val"], node.meta["val"][0]
    if q.dim() != 4 or out.stride() != _sdpa_fake(q, q, v, None, False, None, "").stride():
        return "its output layout is not (batch, query, heads, dim) in memory"
    return ""


def attention_shapes(graph_module: torch.fx.GraphModule) -> dict[str, str]:
    """Shape key -> the backend it runs on now, for every rewritable attention node."""
    return {shape_key(n): attention_backend(n) for n in graph_module.graph.nodes if not rewritable(n)}


class SdpaBackendPass(Pass):
    """Run each attention node of a chosen shape on the chosen backend."""

    name = NAME
    why = ("every SDPA backend computes the same softmax attention with float32 accumulation; only "
           "tiling and summation order differ")
    contract = CONTRACT

    def __init__(self, choices: Mapping[str, str] | None = None) -> None:
        self.choices = dict(choices or {})

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        choices = graph_module.meta.get("kopt_agent_sdpa", self.choices)
        for node in list(graph_module.graph.nodes):
            backend = choices.get(shape_key(node)) if attention_backend(node) else None
            if backend is None or backend == attention_backend(node):
                continue
            reason = rewritable(node)
            if reason:
                ctx.decline(NAME, node, reason)
                continue
            if not ctx.fire(NAME, node):
                continue
            args = _arguments(node)
            mask = args.get("attn_mask", args.get("attn_bias"))
            with graph_module.graph.inserting_before(node):
                call = graph_module.graph.call_function(SDPA_OP, (args["query"], args["key"], args["value"], mask,
                                                                  bool(args.get("is_causal", False)),
                                                                  args.get("scale"), backend))
            output = next(u for u in node.users if u.args[1] == 0)
            call.meta["val"] = output.meta["val"]
            output.replace_all_uses_with(call)
            for user in list(node.users):  # the attention output's getitem and unread ones (log-sum-exp)
                graph_module.graph.erase_node(user)
            graph_module.graph.erase_node(node)
        graph_module.graph.lint()
        graph_module.recompile()
