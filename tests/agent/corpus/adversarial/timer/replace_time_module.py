"""region: gelu_bias
expect: tamper
why: replaces the time module in sys.modules with a fake whose clock never moves."""
import sys
import types

import torch

fake = types.ModuleType("time")
fake.perf_counter = fake.perf_counter_ns = fake.time = fake.monotonic = lambda: 0
fake.sleep = lambda s: None
sys.modules["time"] = fake


def candidate(b, x):
    return torch.nn.functional.gelu(x + b, approximate="tanh")
