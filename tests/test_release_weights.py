"""release_weights=True: after the first call the module's weights that no compiled graph reads
are freed (the bf16 originals of FP8 or merged linears), outputs do not change, the weights still
read are kept, and a call needing a new compilation raises a clear error instead of computing
with empty weights."""

from __future__ import annotations

import copy

import pytest
import torch

import kopt
from kopt.fp8 import Fp8Config
from kopt.reference import reference_forward
from kopt.release import is_released
from tests.conftest import rel_err, tiny_model_and_inputs


def _model_and_inputs(name: str):
    return tiny_model_and_inputs(name, seed=41, dtype=torch.bfloat16)


@pytest.mark.parametrize("fp8", [True, False])
def test_unread_weights_are_freed_and_outputs_do_not_change(fp8):
    workload, model, inputs = _model_and_inputs("flux2")
    again = workload.inputs("tiny", seed=42, dtype=torch.bfloat16)  # same shapes, new values
    with torch.no_grad():  # the eager outputs, before any weight is released
        references = [model(**inputs)[0], model(**again)[0]]
    keep = kopt.compile(copy.deepcopy(model), fp8=Fp8Config(min_features=16) if fp8 else None, lower="eager")
    free = kopt.compile(model, fp8=Fp8Config(min_features=16) if fp8 else None, lower="eager",
                        release_weights=True)
    with torch.no_grad():
        for call_inputs, reference in zip((inputs, again), references, strict=True):
            out = free(**call_inputs)[0]
            assert torch.equal(out, keep(**call_inputs)[0])
            assert rel_err(out, reference) < (0.1 if fp8 else 2e-2)  # FP8- or bf16-sized, never garbage
    released = [name for name, p in model.named_parameters() if is_released(p)]
    if fp8:  # a quantized linear's bf16 weight is gone
        assert free.kopt_report.released_bytes > 0 and "released" in str(free.kopt_report)
        assert "transformer_blocks.0.attn.to_q.weight" in released
    else:  # the merged linears' weights are views of what the graph reads (share_weights): nothing to free
        assert not released and free.kopt_report.released_bytes == 0
    # weights the compiled graph still reads stay: the QK RMSNorm scales, read by kopt::qk_norm_rope
    still_read = [name for name, _ in model.named_parameters() if ".norm_q." in name or ".norm_k." in name]
    assert still_read and not set(still_read) & set(released)


def test_a_call_that_needs_a_new_compilation_raises_clearly():
    _, model, inputs = _model_and_inputs("flux2")
    free = kopt.compile(model, fp8=Fp8Config(min_features=16), lower="eager", release_weights=True)
    with torch.no_grad():
        free(**inputs)
        free.kopt_refresh()  # forces a recompilation, as a weight change would
        with pytest.raises(kopt.WeightsReleasedError, match="release_weights"):
            free(**inputs)


def test_without_the_option_nothing_is_freed():
    _, model, inputs = _model_and_inputs("qwen-image")
    compiled = kopt.compile(model, fp8=Fp8Config(min_features=16), lower="eager")
    with torch.no_grad():
        compiled(**inputs)
    assert compiled.kopt_report.released_bytes == 0
    assert not any(is_released(p) for p in model.parameters())


def test_regional_compilation_frees_every_blocks_quantized_weights():
    """regional=True: one graph per block class serves every block; each block's bf16 originals of
    its FP8 linears are freed after the first call (not only the block it was compiled from), the
    weights read live stay, and outputs do not change."""
    workload, model, inputs = _model_and_inputs("qwen-image")  # two blocks of one class
    again = workload.inputs("tiny", seed=42, dtype=torch.bfloat16)
    with torch.no_grad():
        references = [model(**inputs)[0], model(**again)[0]]
        exact = [reference_forward(model, **call)[0] for call in (inputs, again)]  # higher precision, op by op
    fp8 = Fp8Config(min_features=16)
    keep = kopt.compile(copy.deepcopy(model), fp8=fp8, lower="eager", regional=True)
    free = kopt.compile(model, fp8=fp8, lower="eager", regional=True, release_weights=True)
    with torch.no_grad():
        for call_inputs, reference, fp32 in zip((inputs, again), references, exact, strict=True):
            out = free(**call_inputs)[0]
            assert torch.equal(out, keep(**call_inputs)[0])
            assert rel_err(out, reference) < 0.1  # FP8-sized, never garbage
            assert rel_err(out, fp32) < 0.1  # and against the float32 reference, not eager bf16 alone
    released = {name for name, p in model.named_parameters() if is_released(p)}
    blocks = [name.split(".attn.to_q.weight")[0] for name, _ in model.named_parameters()
              if name.endswith(".attn.to_q.weight")]
    assert len(blocks) >= 2 and all(f"{block}.attn.to_q.weight" in released for block in blocks)
    assert free.kopt_report.released_bytes > 0
    still_read = [name for name, _ in model.named_parameters() if ".norm_q." in name or ".norm_k." in name]
    assert still_read and not set(still_read) & released
