"""Which trials to run: value profiles at the region's own shapes, and awkward other shapes.

Every trial gets fresh random values. The region's own shapes run once per value profile (every
input the same profile), because those are the shapes the candidate will serve. When the region
can be resized (:func:`kopt.agent.interpret.resize_problem`) and the candidate does not declare
itself shape-specialized, each size that can change gets one trial past its own value (:func:`grown`:
a candidate that hard-codes the example's width would pass every trial at or below it), and
hypothesis draws more: sizes from an awkward list (primes, 781, 1823, 1) or anywhere up to 2048,
scaled down to a CPU-feasible element budget, with a value profile per input. Hypothesis only
generates here (no shrinking, no example database): it is the source of varied, boundary-seeking
plans; the verdict comes from the checks.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import threading

from kopt.agent.interpret import resize_problem
from kopt.agent.region import Region
from kopt.agent.sizes import SizeSymbols
from kopt.agent.verify.config import VerifyConfig
from kopt.agent.verify.values import Profile
from kopt.passes.base import Contract, ContractKind

AWKWARD_SIZES = (1, 2, 3, 5, 7, 13, 17, 31, 61, 127, 257, 781, 1823)
_HYPOTHESIS_LOCK = threading.Lock()  # hypothesis' engine is not meant to run in two threads at once


@dataclasses.dataclass(frozen=True)
class TrialPlan:
    """One trial: new sizes per size symbol (empty: the region's own shapes), a value profile per
    input, and the seed of its values."""

    resize: tuple[tuple[int, int], ...]
    profiles: tuple[Profile, ...]
    seed: int

    def describe(self) -> str:
        sizes = ", ".join(f"s{k}={v}" for k, v in self.resize) or "own shapes"
        return f"{sizes}; {'/'.join(p.value for p in self.profiles)}"


def symbols_of(region: Region) -> SizeSymbols:
    return SizeSymbols.of(spec.shape for spec in region.inputs)


def _layouts(region: Region) -> list:
    return [(s.shape, s.stride, s.dtype) for s in region.inputs]


@functools.lru_cache(maxsize=256)
def _resize_ok(region: Region, resize: tuple[tuple[int, int], ...]) -> bool:
    return resize_problem(region.graph_module, symbols_of(region), dict(resize), _layouts(region)) is None


def unexplained_size(region: Region) -> str | None:
    """A size argument the symbols cannot read (``split(x, 16)`` of a width 32): the region's meaning at
    other sizes is then a guess (halves? 16 columns?), so it keeps its own shapes. None if there is none."""
    from kopt.agent.schema_args import size_arguments

    symbols = symbols_of(region)

    def literals(value: object) -> list[int]:
        if isinstance(value, bool):
            return []
        if isinstance(value, int):
            return [value]
        return [i for v in value for i in literals(v)] if isinstance(value, (list, tuple)) else []

    for node in region.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        positions, names = size_arguments(node.target)
        sized = [a for i, a in enumerate(node.args) if i in positions]
        sized += [v for k, v in node.kwargs.items() if k in names]
        for size in (n for a in sized for n in literals(a)):
            if 1 < size < 2**62 and not symbols.exprs(size):
                return f"size {size} in {node.name} = {node.target} is not a size symbol"
    return None


def free_symbols(region: Region) -> tuple[tuple[int, ...], str]:
    """The size symbols that can change on their own, and a note on the ones that cannot."""
    symbols = symbols_of(region)
    unexplained = unexplained_size(region)
    if unexplained:
        return (), f"own shapes only: {unexplained}"
    free, fixed = [], []
    for index, value in enumerate(symbols.values):
        trial = value + 2 if value + 2 not in symbols.values else value + 3
        (free if _resize_ok(region, ((index, trial),)) else fixed).append(index)
    note = f"size symbols {', '.join(f's{i}={symbols.values[i]}' for i in fixed)} stay fixed" if fixed else ""
    return tuple(free), note


def fit(region: Region, resize: dict[int, int], max_elements: int,
        keep: tuple[int, ...] = ()) -> tuple[tuple[int, int], ...]:
    """``resize`` with the largest sizes halved until every input has at most ``max_elements``; sizes of
    the symbols in ``keep`` only once no other symbol of a too-large input can shrink."""
    symbols = symbols_of(region)
    resize = dict(resize)
    while True:
        too_big = [s for s in region.inputs if _numel(symbols.resize_shape(s.shape, resize)) > max_elements]
        if not too_big:
            return tuple(sorted(resize.items()))
        involved = {symbols.values.index(d) for s in too_big for d in s.shape if d > 1}
        others = {i for i in involved if i not in keep and resize.get(i, symbols.values[i]) > 1}
        largest = max(others or involved, key=lambda i: resize.get(i, symbols.values[i]))
        resize[largest] = max(1, resize.get(largest, symbols.values[largest]) // 2)


def grown(region: Region, free: tuple[int, ...], max_elements: int) -> list[tuple[tuple[int, int], ...]]:
    """One resize per free size symbol with that size past the region's own (2·own + 1, odd), the
    other sizes shrunk to make room: a candidate that computes only the example's rows or columns
    (``x[:, :80]`` for a width of 80) fails at least one of these whatever hypothesis draws."""
    values = symbols_of(region).values
    out = []
    for index in free:
        resize = fit(region, {index: 2 * values[index] + 1}, max_elements, keep=(index,))
        if dict(resize).get(index, 0) > values[index] and _resize_ok(region, resize):
            out.append(resize)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _drawn_sizes(free: tuple[int, ...], count: int, seed: int | None) -> list[tuple[dict[int, int], tuple, int]]:
    """``count`` (sizes, per-input profile indices, value seed) drawn by hypothesis (by ``random`` from
    the same size list when hypothesis is not installed: ``pip install kopt[agent]`` brings it)."""
    try:
        import hypothesis
        from hypothesis import strategies as st
    except ImportError:
        rng = random.Random(seed) if seed is not None else random.SystemRandom()
        return [({i: rng.choice(AWKWARD_SIZES) if rng.random() < 0.5 else rng.randint(1, 2048) for i in free},
                 tuple(rng.randrange(64) for _ in range(8)), rng.randrange(2**31)) for _ in range(count)]

    drawn: list = []
    size = st.one_of(st.sampled_from(AWKWARD_SIZES), st.integers(1, 2048))

    @hypothesis.settings(max_examples=count, database=None, phases=[hypothesis.Phase.generate], deadline=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(sizes=st.fixed_dictionaries({i: size for i in free}),
                      profiles=st.lists(st.integers(0, 63), min_size=8, max_size=8),
                      value_seed=st.integers(0, 2**31 - 1))
    def collect(sizes, profiles, value_seed):
        drawn.append((sizes, tuple(profiles), value_seed))

    if seed is not None:
        collect = hypothesis.seed(seed)(collect)

    with _HYPOTHESIS_LOCK:
        collect()
    return drawn[:count]


def profiles_for(contract: Contract, config: VerifyConfig) -> list[Profile]:
    """The value profiles a candidate under ``contract`` must survive. A quality contract (FP8) gives
    up precision by design and is judged on representative data, as the quality gate judges a model:
    the ``offset`` profile (a mean 1000 times the spread), built to break low-precision arithmetic,
    is left out for it; every other profile, NaN propagation included, still applies."""
    profiles = [p for p in Profile if config.nonfinite_inputs or p is not Profile.NONFINITE]
    if contract.kind is ContractKind.QUALITY:
        profiles.remove(Profile.OFFSET)
    return profiles


def plan_trials(region: Region, *, shape_specialized: bool, config: VerifyConfig,
                contract: Contract | None = None) -> tuple[list[TrialPlan], list[str]]:
    """The trials for one verification (for a candidate under ``contract``, default a tolerance), and
    notes for the log (what could not vary, and why)."""
    contract = contract or Contract.tolerance(1e-5)
    rng = random.Random(config.seed) if config.seed is not None else random.SystemRandom()
    profiles = profiles_for(contract, config)
    notes: list[str] = []
    free, fixed_note = ((), "") if shape_specialized else free_symbols(region)
    if fixed_note:
        notes.append(fixed_note)
    own = ()
    if free and any(s.numel > config.max_elements for s in region.inputs):
        own = fit(region, {}, config.max_elements)
        notes.append(f"own shapes scaled to fit {config.max_elements} elements: {own}")
    n = len(region.inputs)
    plans = [TrialPlan(own, (p,) * n, rng.randrange(2**31)) for p in profiles]
    if shape_specialized:
        notes.append("shape-specialized candidate: own shapes only")
        plans += [TrialPlan(own, tuple(rng.choice(profiles) for _ in range(n)), rng.randrange(2**31))
                  for _ in range(2)]
        return plans, notes
    if not free:
        notes.append("the region cannot be resized: own shapes only")
        return plans, notes
    for resize in grown(region, free, config.max_elements)[:config.shape_trials]:
        plans.append(TrialPlan(resize, tuple(rng.choice(profiles) for _ in range(n)), rng.randrange(2**31)))
    for sizes, picks, value_seed in _drawn_sizes(free, config.shape_trials * 3, config.seed):
        resize = fit(region, sizes, config.max_elements)
        if not _resize_ok(region, resize):
            continue
        chosen = tuple(profiles[picks[i % len(picks)] % len(profiles)] for i in range(n))
        if any(p.resize == resize and p.profiles == chosen for p in plans):
            continue
        plans.append(TrialPlan(resize, chosen, value_seed))
        if len(plans) == len(profiles) + config.shape_trials:
            break
    return plans, notes
