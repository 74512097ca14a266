"""What the original region produces for a trial: its outputs in its own dtypes and in float64, the
output layout a candidate must match, and which outputs may share memory with what.

Computed in the parent, and only after the child has exited: the reference never exists while
candidate code runs, so no candidate can read it (from files, memory or the parent).
"""

from __future__ import annotations

import dataclasses

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kopt.agent.interpret import RegionInterpreter, empty_with_layout, run_region
from kopt.agent.region import Region
from kopt.agent.verify.plan import TrialPlan, symbols_of
from kopt.agent.verify.values import values
from kopt.agent.verify.workdir import OutputSpec


@dataclasses.dataclass(frozen=True)
class Reference:
    """The original's outputs for one input set.

    Attributes:
        native: outputs in the region's own dtypes (what it computes today).
        exact: outputs in float64 (its mathematics without intermediate rounding), or ``native``
            where float64 promotion does not run (``exact_note`` says why).
        sensitivity: per output, ``|R(x~) - R(x)|`` in float64 where ``x~`` is the inputs perturbed by
            their dtype's unit roundoff: how much the exact result moves when the inputs are rounded
            once more. A backward-stable implementation in the inputs' precision errs by about this
            much, so the comparison allows a few times it (see :mod:`kopt.agent.verify.compare`).
        input_aliases: per output, the inputs whose storage it shares (a view of an input).
        output_overlaps: per output, the other outputs whose memory it overlaps.
    """

    native: tuple[torch.Tensor, ...]
    exact: tuple[torch.Tensor, ...]
    sensitivity: tuple[torch.Tensor | None, ...]
    input_aliases: tuple[frozenset[int], ...]
    output_overlaps: tuple[frozenset[int], ...]
    exact_note: str = ""


def trial_inputs(region: Region, plan: TrialPlan) -> list[torch.Tensor]:
    """Fresh inputs for ``plan``: its sizes, its value profiles, the original inputs' memory layout
    (dim order and broadcast dims), from the plan's seed."""
    symbols, resize = symbols_of(region), dict(plan.resize)
    generator = torch.Generator().manual_seed(plan.seed)
    made = []
    for spec, profile in zip(region.inputs, plan.profiles, strict=True):
        shape = symbols.resize_shape(spec.shape, resize)
        tensor = empty_with_layout(shape, spec.stride, spec.shape, spec.dtype)
        base_shape = [1 if step == 0 and size != 1 else size for size, step in zip(shape, tensor.stride(), strict=True)]
        base = tensor.as_strided(base_shape, tensor.stride())
        base.copy_(values(base_shape, spec.dtype, profile, generator))
        made.append(tensor)
    return made


def expected_outputs(region: Region, plan: TrialPlan, inputs: list[torch.Tensor]) -> list[OutputSpec]:
    """Shapes, dtypes and strides of the original's outputs at the trial's sizes (FakeTensor run, on
    the CPU: a region captured on a GPU names its device in literals such as ``full(device=cuda)``,
    which follow the fake inputs' device like every other run of a region, :mod:`kopt.agent.interpret`)."""
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode:
        fakes = [empty_with_layout(t.shape, t.stride(), t.shape, t.dtype) for t in inputs]
    interpreter = RegionInterpreter(region.graph_module, symbols=symbols_of(region), resize=dict(plan.resize),
                                    device=torch.device("cpu"))
    with fake_mode, torch.no_grad():
        outputs = interpreter.run(*fakes)
    return [OutputSpec(tuple(int(d) for d in o.shape), o.dtype, tuple(int(s) for s in o.stride())) for o in outputs]


def _footprint(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (0, 0)
    extent = 1 + sum((size - 1) * step for size, step in zip(t.shape, t.stride(), strict=True))
    return (t.data_ptr(), t.data_ptr() + extent * t.element_size())


def reference(region: Region, plan: TrialPlan, inputs: list[torch.Tensor]) -> Reference:
    """Run the original region on ``inputs`` (which it does not modify: its graph is functional)."""
    symbols, resize = symbols_of(region), dict(plan.resize)
    native = run_region(region.graph_module, inputs, symbols=symbols, resize=resize)
    note = ""
    try:
        exact = run_region(region.graph_module, inputs, symbols=symbols, resize=resize, promote=torch.float64)
    except Exception as error:  # noqa: BLE001 - an op without a float64 kernel: fall back, and say so
        exact, note = native, f"no float64 reference ({type(error).__name__}: {str(error)[:120]}); compared with " \
                              "the original's own outputs"
    sensitivity = _sensitivity(region, plan, inputs, exact) if not note else tuple(None for _ in native)
    storages = [t.untyped_storage().data_ptr() for t in inputs]
    aliases = tuple(frozenset(j for j, s in enumerate(storages) if s == o.untyped_storage().data_ptr())
                    for o in native)
    spans = [_footprint(o) for o in native]
    overlaps = tuple(frozenset(j for j, (lo, hi) in enumerate(spans)
                               if j != i and lo < spans[i][1] and spans[i][0] < hi) for i in range(len(native)))
    return Reference(tuple(native), tuple(exact), sensitivity, aliases, overlaps, note)


def _sensitivity(region: Region, plan: TrialPlan, inputs: list[torch.Tensor],
                 exact: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | None, ...]:
    """|R(x~) - R(x)| for inputs perturbed by one unit roundoff of their dtype (float64 throughout)."""
    generator = torch.Generator().manual_seed(plan.seed ^ 0x5EED)
    perturbed = []
    for tensor in inputs:
        if not tensor.is_floating_point():
            perturbed.append(tensor)
            continue
        wide = tensor.double()
        noise = torch.rand(wide.shape, generator=generator, dtype=torch.float64) * 2 - 1
        perturbed.append(wide * (1 + noise * (torch.finfo(tensor.dtype).eps / 2)))
    moved = run_region(region.graph_module, perturbed, symbols=symbols_of(region), resize=dict(plan.resize),
                       promote=torch.float64)
    return tuple((m.double() - e.double()).abs() if e.is_floating_point() else None for m, e in zip(moved, exact,
                                                                                                     strict=True))
