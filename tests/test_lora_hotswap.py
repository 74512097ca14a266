"""LoRA hot-swap through diffusers' and PEFT's own entry points, on tiny FLUX.1 and Qwen-Image
transformers (random weights, random adapters saved to disk): after ``load_lora_adapter(...,
hotswap=True)`` the kopt-compiled model computes what the swapped model computes eagerly, the
rewrites still fire (no fallback to the original graph) and dynamo does not recompile."""

from __future__ import annotations

import pytest
import torch

import kopt
from tests.conftest import rel_err

peft = pytest.importorskip("peft")
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]  # attention projections: to_q/k/v are merged siblings


def _flux():
    """FLUX.1's transformer at a tiny width, and one call's inputs (16 image tokens, 24 text tokens)."""
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
    generator = torch.Generator().manual_seed(7)
    inputs = dict(hidden_states=torch.randn(1, 16, 4, generator=generator),
                  encoder_hidden_states=torch.randn(1, 24, 32, generator=generator),
                  pooled_projections=torch.randn(1, 32, generator=generator),
                  img_ids=torch.randn(16, 3, generator=generator), txt_ids=torch.randn(24, 3, generator=generator),
                  timestep=torch.tensor([0.7]))
    return model, inputs


def _qwen_image():
    from kopt.workloads import get_workload

    workload = get_workload("qwen-image")
    return workload.model("tiny"), workload.inputs("tiny", seed=7)


MODELS = {"flux": _flux, "qwen-image": _qwen_image}


def _output(result):
    return result[0] if isinstance(result, (tuple, list)) else result.sample


def _save_adapters(build, folder, ranks, targets):
    """Random adapters (B not zero, so each changes the output) of the given ranks, saved to disk."""
    from peft import LoraConfig

    files = []
    for index, rank in enumerate(ranks):
        torch.manual_seed(100 + index)
        model, _ = build()
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=False)
        model.add_adapter(config, adapter_name="adapter")
        model.save_lora_adapter(folder / str(index), adapter_name="adapter")
        files.append(folder / str(index) / "pytorch_lora_weights.safetensors")
    return files


def _hot_swapped(name, tmp_path, ranks=(4, 8), targets=TARGETS, via="kopt.compile", **options):
    """Compile with adapter 0, check it, hot-swap adapter 1, check again; returns the report
    (``via="torch.compile"``: as diffusers' own test does, ``mode="reduce-overhead"``)."""
    build = MODELS[name]
    files = _save_adapters(build, tmp_path, ranks, targets)
    torch.manual_seed(0)
    model, inputs = build()
    model.enable_lora_hotswap(target_rank=max(ranks))
    model.load_lora_adapter(files[0], adapter_name="adapter", prefix=None)
    options = {"lower": "eager", **options}
    if via == "kopt.compile":
        compiled = kopt.compile(model, dynamic=False, **options)
    else:  # torch.compile refuses mode= with options=: options={"mode": ...} carries both
        backend = kopt.make_backend(mode="reduce-overhead", **options)
        compiled = torch.compile(model, backend=backend, dynamic=False)
        compiled.kopt_report = backend.report
    with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=True):
        before = _output(model(**inputs))
        assert rel_err(_output(compiled(**inputs)), before) < 1e-4
        model.load_lora_adapter(files[1], adapter_name="adapter", hotswap=True, prefix=None)
        after = _output(model(**inputs))
        assert rel_err(after, before) > 1e-2  # the swap changed the output: the check below means something
        assert rel_err(_output(compiled(**inputs)), after) < 1e-4
        assert rel_err(_output(compiled(**inputs)), after) < 1e-4  # and keeps computing it
    report = compiled.kopt_report
    assert len(report.graphs) == 1 and report.graphs[0].fallback is None, str(report)
    assert report.matches("sibling-merge") > 0
    # weights shared with the merged Q/K/V (the default) took the swap in place; kept apart, the
    # merged weights were derived again
    rederived = 0 if options.get("share_weights", True) else 1
    assert report.graphs[0].weight_rederivations == rederived and report.graphs[0].weight_refreshes == 0
    return report


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("ranks", [(4, 4), (3, 6), (6, 3)], ids=str)
def test_hot_swap_through_diffusers_is_not_stale(name, ranks, tmp_path):
    _hot_swapped(name, tmp_path, ranks)


@pytest.mark.parametrize("name", list(MODELS))
def test_hot_swap_with_weights_kept_apart_derives_the_merged_weights_again(name, tmp_path):
    _hot_swapped(name, tmp_path, share_weights=False)


@pytest.mark.parametrize("name", list(MODELS))
def test_hot_swap_through_torch_compile_in_reduce_overhead_mode(name, tmp_path):
    _hot_swapped(name, tmp_path, via="torch.compile")


def test_hot_swap_of_a_memoized_modulation_layer(tmp_path):
    """An adapter on FLUX.1's modulation linears (step-invariant: hoisted and memoized by staging):
    the memo is dropped when the swap changes them (weights kept apart: every change re-derives)."""
    report = _hot_swapped("flux", tmp_path, targets=["to_q", "norm1.linear", "norm.linear"], share_weights=False)
    assert report.graphs[0].memo is not None and report.matches("staging") > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_hot_swap_through_inductor(name, tmp_path):
    """The same with Inductor's lowering (derived weights are inputs of the lowered graph)."""
    report = _hot_swapped(name, tmp_path, lower="inductor")
    assert report.graphs[0].lowering == "inductor"
