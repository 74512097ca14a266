"""The GPU's SM clock and board power while a row's timed calls run, recorded beside its time.

An H100 or H200 at its power limit lowers its SM clock, and the denser a forward's schedule (fewer
launch gaps, more back-to-back GEMMs) the more it does: two rows can run the same cuBLAS or cuDNN
kernel at different clocks, and the same kernel then measures slower in the faster forward. With the
clock beside each row, a kernel-time difference between rows can be compared with their clock
difference instead of being read as a code effect.

``torch.cuda.clock_rate`` and ``torch.cuda.power_draw`` read NVML (the driver's own counters, as
``nvidia-smi`` does), sampled from a background thread every ``interval_s``; the row keeps the
medians. Without NVML (the CPU, a GPU image without ``pynvml``) the fields stay None.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

Reader = Callable[[], tuple[float, float]]  # (SM clock MHz, board power W)


def nvml_reader(device: torch.device) -> Reader | None:
    """A reader of ``device``'s SM clock and power, or None where NVML cannot be read."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch.cuda.clock_rate(index), torch.cuda.power_draw(index)
    except Exception:  # noqa: BLE001 - no pynvml, no permission, an old driver: nothing to record
        return None
    return lambda: (float(torch.cuda.clock_rate(index)), torch.cuda.power_draw(index) / 1e3)


class DeviceState:
    """Samples a reader while its block runs; ``sm_clock_mhz`` and ``power_w`` are the medians."""

    def __init__(self, reader: Reader | None, interval_s: float = 0.05) -> None:
        from benchmarks.tools.periodic import Periodic

        self.reader = reader
        self.clocks: list[float] = []
        self.powers: list[float] = []
        self._periodic = Periodic(self._sample, interval_s, "device-state") if reader is not None else None

    def __enter__(self) -> DeviceState:
        if self._periodic is not None:
            self._periodic.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._periodic is not None:
            self._periodic.__exit__(*exc)
            if not self.clocks:  # a block shorter than one interval
                self._sample()

    def _sample(self) -> None:
        assert self.reader is not None
        try:
            clock, power = self.reader()
        except Exception:  # noqa: BLE001 - a failed read leaves this sample out, never the row
            return
        self.clocks.append(clock)
        self.powers.append(power)

    @property
    def sm_clock_mhz(self) -> float | None:
        return statistics.median(self.clocks) if self.clocks else None

    @property
    def power_w(self) -> float | None:
        return statistics.median(self.powers) if self.powers else None
