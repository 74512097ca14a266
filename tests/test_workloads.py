"""Workloads: built-ins, user factories, and the CFG pair's fresh timestep tensors."""

from __future__ import annotations

import pytest
import torch

from kopt.workloads import Workload, flux2, get_workload


def make_linear_workload() -> Workload:
    return Workload("linear", "a user workload", build_model=lambda size: torch.nn.Linear(4, 4),
                    build_inputs=lambda size, device, dtype, gen, neg: {"input": torch.randn(2, 4, generator=gen)},
                    step_invariant=(), timestep_arg=None)


def test_user_workload_by_import_path():
    workload = get_workload("tests.test_workloads:make_linear_workload")
    model = workload.model()
    assert model(**workload.inputs()).shape == (2, 4)


def test_unknown_workload_is_a_clear_error():
    with pytest.raises(KeyError, match="qwen-image"):
        get_workload("qwen")


def test_cfg_pair_builds_a_new_timestep_tensor_per_call():
    """Same timestep value, different tensor objects: what the diffusers pipelines do."""
    seen = []

    def spy(**kwargs):
        seen.append(kwargs["timestep"])
        return kwargs["hidden_states"].sum()

    workload = get_workload("flux2")
    cond, uncond = workload.inputs(seed=1), workload.inputs(seed=2, negative=True)
    workload.cfg_pair(spy, cond, uncond, t=250.0)
    assert seen[0] is not seen[1] and torch.equal(seen[0], seen[1])
    assert seen[0].item() == pytest.approx(0.25)


def test_flux2_ids_follow_the_pipeline_layout():
    ids = flux2.image_ids(3, 4)
    assert ids.shape == (1, 12, 4) and ids[0, 5].tolist() == [0, 1, 1, 0]
    assert flux2.text_ids(5)[0, :, 3].tolist() == [0, 1, 2, 3, 4]


def test_qwen_negative_prompt_is_masked():
    workload = get_workload("qwen-image")
    cond, uncond = workload.inputs(seed=0), workload.inputs(seed=0, negative=True)
    assert cond["encoder_hidden_states_mask"].all() and not uncond["encoder_hidden_states_mask"].all()


def test_full_size_on_cpu_is_refused_with_a_way_out():
    with pytest.raises(ValueError, match="device='meta'"):
        get_workload("qwen-image").model("full")
