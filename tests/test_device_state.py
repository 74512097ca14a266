"""The benchmark harness records the GPU's SM clock and power over each row's timed calls
(``benchmarks/dit/device_state.py``): medians of what the reader gave while the block ran, nothing
where there is no reader, and a failed read costs a sample, never the row."""

from __future__ import annotations

import itertools
import time

import torch

from benchmarks.dit.device_state import DeviceState, nvml_reader


def test_medians_of_the_readings_taken_while_the_block_ran():
    readings = itertools.cycle([(1980.0, 350.0), (1755.0, 699.0), (1830.0, 690.0)])
    with DeviceState(lambda: next(readings), interval_s=0.005) as state:
        time.sleep(0.2)
    assert len(state.clocks) >= 10
    assert state.sm_clock_mhz in (1980.0, 1755.0, 1830.0) and state.power_w in (350.0, 699.0, 690.0)
    assert min(state.clocks) == 1755.0 and max(state.powers) == 699.0


def test_a_block_shorter_than_one_interval_still_gets_a_reading():
    with DeviceState(lambda: (1500.0, 400.0), interval_s=10.0) as state:
        pass
    assert state.sm_clock_mhz == 1500.0 and state.power_w == 400.0


def test_failed_reads_are_left_out_and_no_reader_records_nothing():
    calls = itertools.count()

    def flaky() -> tuple[float, float]:
        if next(calls) % 2:
            raise RuntimeError("NVML busy")
        return 1900.0, 500.0

    with DeviceState(flaky, interval_s=0.005) as state:
        time.sleep(0.1)
    assert state.clocks and set(state.clocks) == {1900.0}
    with DeviceState(None) as nothing:
        time.sleep(0.01)
    assert nothing.sm_clock_mhz is None and nothing.power_w is None
    assert nvml_reader(torch.device("cpu")) is None


def test_a_cpu_row_has_no_clock_and_the_table_says_so():
    from benchmarks.dit.measure import benchmark
    from benchmarks.dit.results_io import rows_table

    timing, _ = benchmark(lambda: torch.randn(64, 64) @ torch.randn(64, 64), torch.device("cpu"), warmup=1,
                          repeats=3)
    assert timing.sm_clock_mhz is None and timing.power_w is None
    row = dict(model="m", variant="v", call="forward", median_ms=1.0, sm_clock_mhz=1755.0, power_w=699.4)
    assert "| 1755, 699 |" in rows_table([row])
    assert "| – |" in rows_table([{**row, "sm_clock_mhz": None}])
