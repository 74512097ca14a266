"""Computing the reference, compiling and calling leave torch's process-wide configuration as they found it.

Why: Inductor keys its caches by this configuration (its own, dynamo's, functorch's, the float32
precision settings), and a user's code reads it. A setting kopt changed and did not restore made every
graph compiled later in the process miss the cache a fresh process fills (the warm compiles of issue 18
paid a cold lowering; ``kopt.matmul_precision``), and would change what the user's own matmuls compute.
"""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo.config as dynamo_config
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config

import kopt
from kopt.matmul_precision import precision_settings
from kopt.reference import reference_forward
from tests.conftest import rel_err, tiny_model_and_inputs


def _configuration() -> dict[str, Any]:
    matmul = torch.backends.cuda.matmul
    return dict(inductor=inductor_config.save_config_portable(), dynamo=dynamo_config.save_config_portable(),
                functorch=functorch_config.save_config_portable(), precision=precision_settings(),
                reduced_precision=(matmul.allow_bf16_reduced_precision_reduction,
                                   matmul.allow_fp16_reduced_precision_reduction),
                deterministic=torch.are_deterministic_algorithms_enabled(),
                default_dtype=torch.get_default_dtype(), grad=torch.is_grad_enabled())


def _changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    changed = {}
    for key, value in before.items():
        if isinstance(value, dict):
            changed.update({f"{key}.{k}": (value.get(k), after[key].get(k))
                            for k in value.keys() | after[key].keys() if value.get(k) != after[key].get(k)})
        elif value != after[key]:
            changed[key] = (value, after[key])
    return changed


def test_reference_compile_and_calls_change_no_process_wide_setting():
    _, model, inputs = tiny_model_and_inputs("sd3", seed=3, dtype=torch.float32)
    before = _configuration()
    with torch.no_grad():
        exact = reference_forward(model, **inputs)[0]
        compiled = kopt.compile(model, regional=True, progress=False)
        first, second = compiled(**inputs)[0], compiled(**inputs)[0]
    assert 0 < rel_err(first, exact) < 1e-4 and 0 < rel_err(second, exact) < 1e-4  # it compiled and ran
    graphs = compiled.kopt_report.graphs  # Inductor lowered kopt's graphs (the default), not eager
    assert graphs and all(g.lowering.startswith("inductor") for g in graphs), [g.lowering for g in graphs]
    assert _changed(before, _configuration()) == {}
