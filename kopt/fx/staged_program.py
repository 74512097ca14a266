"""Run a graph in two stages: the hoisted step-invariant part only when its inputs' values change.

``split_stages`` cuts a graph whose step-invariant frontier was marked by the staging pass into

    invariant(*key_inputs) -> frontier values
    main(*all_inputs, *frontier values) -> outputs

and :class:`StagedProgram` calls ``invariant`` through a small LRU memo keyed on the *bytes* of
the key inputs (a pipeline builds a new ``timestep / 1000`` tensor for every call, so identity
would never hit; equal bytes mean equal values, so a hit returns exactly what a recomputation
would). Weights the stage reads as inputs are passed but not keyed (hashing them per call would
read them all): whoever changes them calls :meth:`StagedProgram.clear` (the backend's weight
guard does). The memo holds at most ``capacity`` entries, so a long denoising loop cannot grow it.

Reading the key values copies a few bytes to the host (one copy for all of them), which waits for
the GPU work queued before the call: the host cannot run ahead of the GPU into the next call. That
pays when the memo hits (a CFG pair: two calls, one stage), not when every call brings a new
timestep (a guidance-distilled pipeline such as FLUX.1-dev's). So after ``probe_misses`` misses in a
row, the next ``bypass_calls`` calls compute the stage without reading the keys, exactly as a miss
would; then the memo is probed again. A bypassed call computes what a miss computes from the same
inputs and weights, so the outputs are the same either way. It runs ``both`` (by default
:class:`BothStages` of the two; kopt passes the same program replayed from one CUDA graph on a GPU).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kopt.config import Role
from kopt.cuda_graphs import capturing


@dataclasses.dataclass
class StageSplit:
    invariant: torch.fx.GraphModule
    main: torch.fx.GraphModule
    key_positions: list[int]  # which of the original inputs the invariant stage reads
    weight_positions: list[int] = dataclasses.field(default_factory=list)  # of those, weights (not keyed)


def split_stages(graph_module: torch.fx.GraphModule, frontier_names: Sequence[str]) -> StageSplit:
    """Cut ``graph_module`` at the named frontier nodes (see the module docstring)."""
    by_name = {n.name: n for n in graph_module.graph.nodes}
    missing = [name for name in frontier_names if name not in by_name]
    if missing:
        raise KeyError(f"frontier values {missing} no longer exist (a later pass removed them)")
    frontier = [by_name[name] for name in frontier_names]
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]

    hoisted: set[torch.fx.Node] = set()
    stack = list(frontier)
    while stack:
        node = stack.pop()
        if node not in hoisted:
            hoisted.add(node)
            stack.extend(node.all_input_nodes)
    keys = [p for p in placeholders if p in hoisted]

    invariant_graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph_module.graph.nodes:
        if node in hoisted:
            env[node] = invariant_graph.node_copy(node, lambda n: env[n])
    invariant_graph.output(tuple(env[n] for n in frontier))
    invariant = torch.fx.GraphModule(graph_module, invariant_graph)

    main_graph = torch.fx.Graph()
    main_graph._codegen = graph_module.graph._codegen
    env = {}
    last_placeholder = placeholders[-1] if placeholders else None
    inputs_for_frontier: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in graph_module.graph.nodes:
        if node in frontier:
            env[node] = inputs_for_frontier[node]
            continue
        env[node] = main_graph.node_copy(node, lambda n: env[n])
        if node is last_placeholder or (last_placeholder is None and not inputs_for_frontier):
            for index, value in enumerate(frontier):
                placeholder = main_graph.placeholder(f"hoisted_{index}")
                placeholder.meta = dict(value.meta)
                inputs_for_frontier[value] = placeholder
    main_graph.eliminate_dead_code()
    main = torch.fx.GraphModule(graph_module, main_graph)
    weights = [placeholders.index(k) for k in keys if k.meta.get("kopt_role") is Role.CONSTANT]
    return StageSplit(invariant, main, [placeholders.index(k) for k in keys], weights)


def value_key(tensors: Sequence[Any]) -> tuple[Any, ...]:
    """A hashable key equal exactly when the inputs have equal shape, dtype, device and bytes."""
    parts: list[tuple[Any, ...]] = []
    vectors: list[torch.Tensor] = []  # the tensors' bytes, read to the host together below
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
            parts.append((tuple(tensor.shape), tensor.dtype, "meta"))  # no values: shapes are all there is
        elif isinstance(tensor, torch.Tensor):
            parts.append((tuple(tensor.shape), tensor.dtype, tensor.device, len(vectors)))
            vectors.append(_bytes_of(tensor))
        else:
            parts.append(("value", tensor))
    raw = _read_to_host(vectors)
    return tuple((*p[:3], raw[p[3]]) if len(p) == 4 else p for p in parts)


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's values as a dense uint8 vector (still on its device). A fresh copy:
    ``contiguous()`` keeps the zero stride of ``t.expand(1)`` (a size-1 dim counts as contiguous
    whatever its stride), which ``view(uint8)`` refuses."""
    return tensor.detach().reshape(-1).clone(memory_format=torch.contiguous_format).view(torch.uint8)


def _read_to_host(vectors: list[torch.Tensor]) -> list[bytes]:
    """Each uint8 vector's bytes, in order: one copy to the host per device (each copy waits for
    the device), not one per key tensor."""
    raw: list[bytes] = [b""] * len(vectors)
    by_device: dict[torch.device, list[int]] = {}
    for index, vector in enumerate(vectors):
        by_device.setdefault(vector.device, []).append(index)
    for indices in by_device.values():
        group = [vectors[i] for i in indices]
        joined = (torch.cat(group) if len(group) > 1 else group[0]).cpu().numpy().tobytes()
        offset = 0
        for index, vector in zip(indices, group, strict=True):
            raw[index] = joined[offset:offset + vector.numel()]
            offset += vector.numel()
    return raw


class BothStages:
    """``main(*inputs, *invariant(*key inputs))``: the two stages as one program (the memo's bypass)."""

    def __init__(self, invariant: Callable[..., Any], main: Callable[..., Any], key_positions: Sequence[int]) -> None:
        self.invariant, self.main, self.key_positions = invariant, main, list(key_positions)

    def __call__(self, *args: Any) -> Any:
        return self.main(*args, *self.invariant(*[args[i] for i in self.key_positions]))


@dataclasses.dataclass
class MemoStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bypassed: int = 0  # calls that computed the stage without reading the keys (see the module docstring)

    @property
    def calls(self) -> int:
        return self.hits + self.misses + self.bypassed


class StagedProgram:
    """``main(*inputs, *invariant(*key inputs))`` with ``invariant`` memoized on input values."""

    def __init__(self, invariant: Callable[..., Any], main: Callable[..., Any], key_positions: list[int],
                 capacity: int = 2, stats: MemoStats | None = None, weight_positions: Sequence[int] = (),
                 probe_misses: int = 3, bypass_calls: int = 32, both: Callable[..., Any] | None = None) -> None:
        if capacity < 1:
            raise ValueError("the memo needs room for at least one entry")
        self.invariant, self.main, self.key_positions = invariant, main, key_positions
        self.value_positions = [i for i in key_positions if i not in set(weight_positions)]
        self.capacity = capacity
        self.stats = stats or MemoStats()
        self.probe_misses, self.bypass_calls = probe_misses, bypass_calls  # probe_misses=0: never bypass
        self.both = both if both is not None else BothStages(invariant, main, key_positions)
        self._misses_in_row = 0
        self._bypass_left = 0
        self._memo: collections.OrderedDict[tuple[Any, ...], tuple[Any, ...]] = collections.OrderedDict()

    def hoisted_values(self, args: Sequence[Any]) -> tuple[Any, ...]:
        keys = [args[i] for i in self.key_positions]
        key = value_key([args[i] for i in self.value_positions])
        cached = self._memo.get(key)
        if cached is not None:
            self._memo.move_to_end(key)
            self.stats.hits += 1
            self._misses_in_row = 0
            return cached
        self.stats.misses += 1
        self._misses_in_row += 1
        if self.probe_misses and self._misses_in_row >= self.probe_misses:
            self._misses_in_row, self._bypass_left = 0, self.bypass_calls
        values = tuple(self.invariant(*keys))
        self._memo[key] = values
        while len(self._memo) > self.capacity:
            self._memo.popitem(last=False)
            self.stats.evictions += 1
        self.stats.entries = len(self._memo)
        return values

    def clear(self) -> None:
        """Forget every memoized result (a weight the stage reads changed)."""
        self._memo.clear()
        self.stats.entries = 0

    def __call__(self, *args: Any) -> Any:
        if capturing():  # a recording cannot wait for the keys, and its replays never consult the memo
            return self.both(*args)
        if self._bypass_left > 0:
            self._bypass_left -= 1
            self.stats.bypassed += 1
            return self.both(*args)
        return self.main(*args, *self.hoisted_values(args))

    def __len__(self) -> int:
        return len(self._memo)
