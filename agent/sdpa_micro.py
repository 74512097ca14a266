"""Micro pruning for an attention-backend choice: time that attention alone on the backend it runs on
now and on the chosen one, before paying for the whole-model A/B.

Why it is valid: the choice (:mod:`kopt.agent.sdpa_backend`) changes only which kernel computes the
attention nodes of one shape; every other node of the graph is left as it was. So the model can gain
at most what one such node gains, times how many of them a call runs: the same bar and Amdahl bound
as a region candidate's (:meth:`kopt.agent.micro.MicroBench.judge`). Both sides run through the same
op (:func:`kopt.agent.sdpa_backend._sdpa`) on inputs with the node's shapes, dtypes and strides, so
the comparison is of the kernels alone. A backend that cannot run the shape (no kernel for that
dtype, head size or mask) is settled here too.

Not used with the deterministic cost model (it has no attention times; its clock judges the choice).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kopt.agent.candidate import Candidate, CandidateKind

WARMUP = 3
SAMPLES = 20


def _backends(choice: Candidate | None) -> dict[str, str]:
    """Attention shape -> backend that a pipeline choice sets (none for anything else)."""
    from kopt.agent.pipeline_choice import from_candidate

    return dict(from_candidate(choice).sdpa) if choice is not None and choice.kind is CandidateKind.PASS_CHOICE else {}


def _filled(meta: torch.Tensor, device: torch.device, generator: torch.Generator) -> torch.Tensor:
    """A tensor with ``meta``'s shape, dtype and strides, on ``device``, with random contents."""
    out = torch.empty_strided(tuple(meta.shape), tuple(meta.stride()), dtype=meta.dtype, device=device)
    if meta.dtype == torch.bool:
        return out.copy_(torch.rand(tuple(meta.shape), generator=generator) < 0.9)
    return out.copy_(torch.randn(tuple(meta.shape), generator=generator))


def attention_inputs(node: torch.fx.Node, device: torch.device, seed: int = 0) -> tuple:
    """Fresh (q, k, v, mask, is_causal, scale) for one captured attention node, on ``device``."""
    from kopt.agent.sdpa_backend import _arguments

    args = _arguments(node)
    generator = torch.Generator().manual_seed(seed)
    mask_node = args.get("attn_mask", args.get("attn_bias"))
    q, k, v = (_filled(args[name].meta["val"], device, generator) for name in ("query", "key", "value"))
    mask = _filled(mask_node.meta["val"], device, generator) if isinstance(mask_node, torch.fx.Node) else None
    return q, k, v, mask, bool(args.get("is_causal", False)), args.get("scale")


def _time_ms(inputs: tuple, backend: str, device: torch.device) -> float:
    from kopt.agent.sdpa_backend import _sdpa

    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _sdpa(*inputs, backend)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    _sdpa(*inputs, backend)
    return (time.perf_counter() - began) * 1e3


def time_backends(inputs: tuple, current: str, chosen: str, device: torch.device,
                  samples: int = SAMPLES) -> tuple[list[float], list[float]]:
    """``samples`` times (ms) of each backend on ``inputs``, interleaved so drift hits both alike."""
    with torch.no_grad():
        for _ in range(WARMUP):
            _time_ms(inputs, current, device)
            _time_ms(inputs, chosen, device)
        now, new = [], []
        for i in range(samples):
            order = ((now, current), (new, chosen)) if i % 2 == 0 else ((new, chosen), (now, current))
            for side, backend in order:
                side.append(_time_ms(inputs, backend, device))
    return now, new


def check_attention_choice(candidate: Candidate, graphs: Sequence[Any], accepted: Mapping[str, Candidate],
                           micro: Any) -> Any:
    """A :class:`kopt.agent.micro.MicroResult` for a choice that moves one attention shape to another
    backend; None when the choice is something else (or the clock is the cost model)."""
    from kopt.agent.micro import MicroResult
    from kopt.agent.sdpa_backend import attention_backend, rewritable, shape_key

    if candidate.kind is not CandidateKind.PASS_CHOICE or micro.cost_model:
        return None
    kept = accepted.get(candidate.region_signature)
    before = _backends(kept)
    new = {shape: backend for shape, backend in _backends(candidate).items() if before.get(shape) != backend}
    graph = next((g for g in graphs if g.signature == candidate.region_signature), None)
    if len(new) != 1 or graph is None:
        return None
    (shape, backend), = new.items()
    nodes = [n for n in graph.graph_module.graph.nodes
             if attention_backend(n) and shape_key(n) == shape and not rewritable(n)]
    if not nodes:
        return None
    current = before.get(shape, attention_backend(nodes[0]))
    device = next((a.device for a in graph.args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    inputs = attention_inputs(nodes[0], device, seed=int(candidate.content_hash[:8], 16))
    try:
        now, new_ms = time_backends(inputs, current, backend, device)
    except torch.OutOfMemoryError as error:  # the model under optimization holds the memory: retry later
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return MicroResult(False, f"micro: attention {shape} on {backend}: no device memory free to time it: "
                                  f"{first_line[:160]}", None, inconclusive=True)
    except (RuntimeError, ValueError, NotImplementedError) as error:  # e.g. "No available kernel"
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return MicroResult(False, f"micro: attention {shape} cannot run on {backend}: {first_line[:200]}", None)
    # the graph runs once per block of its class (``calls``): a block graph's one attention is 32 on Llama
    return micro.judge(now, new_ms, against=f"attention {shape} on {current}", signature=candidate.region_signature,
                       occurrences=len(nodes) * max(1, graph.calls))
