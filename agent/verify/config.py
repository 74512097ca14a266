"""Typed settings of the verifier; the defaults are what the agent uses on the CPU."""

from __future__ import annotations

import dataclasses

from kopt.agent.verify.compare import Slack


def _check_device(owner: str, device: str) -> None:
    if device != "cpu" and not device.startswith("cuda:"):
        raise ValueError(f"{owner}.device must be 'cpu' or 'cuda:N', got {device!r}")


@dataclasses.dataclass(frozen=True)
class VerifyConfig:
    """How hard to test one candidate.

    Attributes:
        shape_trials: trials at other sizes drawn by hypothesis (when the region allows resizing and
            the candidate is not shape-specialized), on top of one trial per value profile at the
            region's own shapes.
        max_elements: cap on the elements of any one input in a trial (awkward sizes such as
            1823 x 781 are scaled down to fit; the captured shapes are used as they are if they fit).
        nonfinite_inputs: include trials whose inputs hold NaN and +-inf, so a candidate must
            propagate them where the original does (and must not invent them where it does not).
        slack: the factors of the numeric rules (:class:`kopt.agent.verify.compare.Slack`): how many
            times the original's own error a candidate may have, and how far one row or one element
            may exceed the bound (catching partial writes a norm would average away).
        seed: fix the trial plan and input values (None: fresh randomness every verification).
        timeout_s: wall-clock limit of the whole child process (startup, import, every trial).
        call_timeout_s: limit of one call (a candidate that sleeps is stopped here); generous, because
            a Triton candidate verified on the CPU runs in Triton's interpreter.
        memory_mb: address space the child may map beyond what torch needs after import.
        cpu_seconds: CPU-time limit of the child (a backstop to the timeouts).
        late_wait_s: how long the harness waits after the last call before it re-reads the outputs
            (background threads, reused buffers).
        threads: torch intra-op threads in the child (1 keeps parallel verifications fair).
        python: the interpreter for the child (None: the current one).
        cuda_devices: the child's ``CUDA_VISIBLE_DEVICES`` (a worker of :mod:`kopt.agent.pool` pins its
            children to its GPU this way); None leaves it unset, so the child sees every GPU.
        device: where the trials of a candidate kopt generated itself (origin ``search``: its codegen
            with other launch parameters) run: ``"cpu"``, or ``"cuda:N"`` when the model runs there. A
            region whose sizes cannot change is verified at its own shapes, which Triton's interpreter
            takes minutes for at full size; a compiled kernel takes milliseconds. Every other candidate
            (an LLM's, a person's) is verified on the CPU behind every wall, whatever this says.
    """

    shape_trials: int = 6
    max_elements: int = 1 << 16
    nonfinite_inputs: bool = True
    slack: Slack = Slack()
    seed: int | None = None
    timeout_s: float = 240.0
    call_timeout_s: float = 60.0
    memory_mb: int = 2048
    cpu_seconds: int = 300
    late_wait_s: float = 0.05
    threads: int = 1
    python: str | None = None
    cuda_devices: str | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        _check_device("VerifyConfig", self.device)


GENERATED_ORIGINS = frozenset({"search"})  # proposers whose candidates are kopt's own generated code


@dataclasses.dataclass(frozen=True)
class TimingConfig:
    """How to time a candidate in a fresh child process.

    Attributes:
        input_sets: distinct input sets, regenerated for the run; calls cycle through them, so a
            candidate that caches a result returns it for the wrong inputs and fails the check
            every timed call gets.
        rounds: timed passes over the input sets (samples = input_sets x rounds).
        warmup: untimed calls first (lazy initialization, allocator warm-up, Triton's JIT).
        device: where the timed calls run: ``"cpu"``, or ``"cuda:N"`` for a region of a model that runs
            on that GPU (a CPU time says nothing about a GPU kernel). Verification always runs on the
            CPU behind every wall; :mod:`kopt.agent.verify.child` says which walls timing on a GPU keeps.
    """

    input_sets: int = 4
    rounds: int = 5
    warmup: int = 2
    device: str = "cpu"

    def __post_init__(self) -> None:
        _check_device("TimingConfig", self.device)
