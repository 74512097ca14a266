"""Smoke test of the DiT benchmark harness: the CLI runs on tiny models and writes sane results.

Timings on the CPU mean nothing; this checks the plumbing (rows per variant, errors against eager,
breakdown, output files) with the cheap variants only (no Inductor: it takes tens of seconds per
graph on a small CPU), plus the pieces whose logic the numbers depend on.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.dit.breakdown import classify, forward_timeline
from benchmarks.dit.fp8_baseline import RowwiseFp8Linear, quantize_linears, set_fast_accum
from benchmarks.dit.variants import select

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
VARIANTS = ("eager", "kopt-eager", "fp8-eager")


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    command = [sys.executable, str(REPO / "benchmarks" / "dit" / "dit.py"), "--size", "tiny", "--device", "cpu",
               "--variants", ",".join(VARIANTS), "--repeats", "1", "--warmup", "0",
               "--profile-forwards", "1", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().splitlines()[-1].startswith("|"), "the markdown table must come last"
    stem = out / "dit-tiny-qwen-image+flux2"
    assert stem.with_suffix(".md").exists()
    return json.loads(stem.with_suffix(".json").read_text())


def _row(results: dict, model: str, variant: str, call: str = "forward") -> dict:
    (row,) = [r for r in results["rows"] if (r["model"], r["variant"], r["call"]) == (model, variant, call)]
    return row


@pytest.mark.parametrize("model", ["qwen-image", "flux2"])
def test_every_requested_variant_has_a_finite_measured_row(tiny_results: dict, model: str) -> None:
    for variant in VARIANTS:
        row = _row(tiny_results, model, variant)
        assert row["status"] == "ok", row["status"]
        assert row["rel_err"] is not None and math.isfinite(row["rel_err"])
        # the CPU has no peak memory to report
        assert row["median_ms"] > 0 and row["peak_gb"] is None and row["first_call_peak_gb"] is None
    eager = _row(tiny_results, model, "eager")
    # rel_err / cosine: against the float64 reference, where fp32 eager is a little off
    assert eager["rel_err_vs_eager"] == 0.0 and 0 < eager["rel_err"] < 1e-5
    assert _row(tiny_results, model, "kopt-eager")["rel_err_vs_eager"] < 1e-5
    assert _row(tiny_results, model, "kopt-eager")["rel_err"] < 1e-5
    assert _row(tiny_results, model, "kopt-eager", "cfg-pair")["rel_err"] < 1e-5
    assert _row(tiny_results, model, "fp8-eager")["cosine"] > 0.9
    assert _row(tiny_results, model, "fp8-eager")["cosine_vs_eager"] > 0.9
    assert _row(tiny_results, model, "fp8-eager", "cfg-pair")["cosine"] > 0.9  # every baseline has a CFG row


@pytest.mark.parametrize("model", ["qwen-image", "flux2"])
def test_staged_kopt_gets_a_memo_hit_row_that_hits(tiny_results: dict, model: str) -> None:
    """The repeated-timestep row exists only for variants with a step-invariant stage and matches
    eager; the memo recorded hits (from this row and the CFG pairs' second calls)."""
    hit = _row(tiny_results, model, "kopt-eager", "forward-memo-hit")
    assert hit["status"] == "ok" and hit["rel_err"] < 1e-5 and hit["rel_err_vs_eager"] < 1e-5
    assert not [r for r in tiny_results["rows"] if r["call"] == "forward-memo-hit" and r["variant"] != "kopt-eager"]
    (memo,) = [g["memo"] for g in tiny_results["kopt_reports"][f"{model}/kopt-eager"]["graphs"] if g["memo"]]
    assert memo["hits"] >= 1


def test_results_carry_breakdown_flops_and_kopt_report(tiny_results: dict) -> None:
    assert {(b["model"], b["variant"], b["call"]) for b in tiny_results["breakdown"]} == {
        (m, v, "forward") for m in ("qwen-image", "flux2") for v in VARIANTS} | {
        (m, "kopt-eager", "forward-memo-hit") for m in ("qwen-image", "flux2")}
    assert all(b["kernel_ms"] > 0 for b in tiny_results["breakdown"])
    assert all(info["flops"]["gemm"] > 0 for info in tiny_results["per_model"].values())
    assert "qwen-image/kopt-eager" in tiny_results["kopt_reports"]
    assert tiny_results["ceilings"] is None  # GPU only


def test_rows_and_tables_carry_errors_against_the_reference_and_against_eager(tiny_results: dict) -> None:
    """Every measured row has both pairs of numbers; the markdown shows both; each model says what its
    reference was and how far eager is from it."""
    measured = [r for r in tiny_results["rows"] if r["status"] == "ok"]
    assert measured and all(r[key] is not None for r in measured
                            for key in ("rel_err", "cosine", "rel_err_vs_eager", "cosine_vs_eager"))
    for info in tiny_results["per_model"].values():
        assert info["reference"]["dtype"] == "float64" and info["eager_vs_reference"]["rel_err"] > 0
    from benchmarks.dit.results_io import render_markdown, rows_table, short_table

    assert "| rel err | cosine | rel err vs eager | cosine vs eager |" in rows_table(tiny_results["rows"])
    assert "rel err vs eager" in short_table(tiny_results["rows"])
    assert "reference: float64" in render_markdown(tiny_results)


def test_a_flux1_workload_gets_rows_against_an_fp64_reference(tmp_path: Path) -> None:
    """``--models`` takes a workload by ``module:factory`` (the zoo's ``flux1`` goes the same way): in bf16
    with guidance 3.5, eager's own row is 1e-2 off the reference and kopt's rows carry both numbers."""
    workload = "tests.tiny_flux1:workload"
    command = [sys.executable, str(REPO / "benchmarks" / "dit" / "dit.py"), "--size", "tiny", "--device", "cpu",
               "--dtype", "bf16", "--models", workload, "--variants", "eager,kopt-eager", "--repeats", "1",
               "--warmup", "0", "--profile-forwards", "0", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / f"dit-tiny-{workload}.json").read_text())
    eager, kopt_row = _row(results, workload, "eager"), _row(results, workload, "kopt-eager")
    assert eager["rel_err"] > 1e-2 and eager["cosine"] < 0.9999 and eager["rel_err_vs_eager"] == 0.0
    assert kopt_row["rel_err"] is not None and kopt_row["rel_err_vs_eager"] < 2e-2


@pytest.mark.parametrize("name, category", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"), ("nvjet_tst_192x192_64x4", "gemm"),
    ("void cutlass::device_kernel<f8f8bf16_rowwise>", "gemm"), ("triton_tem_fused_mm_3", "gemm"),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("triton_poi_fused__scaled_dot_product_flash_attention_0", "norm_elementwise"),
    ("void at::native::vectorized_layer_norm_kernel<c10::BFloat16>", "norm_elementwise"),
    ("void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>", "copies"),
    ("void at::native::CatArrayBatchedCopy<>", "copies"), ("Memcpy DtoD (Device -> Device)", "copies"),
    ("_gated_residual_kernel", "norm_elementwise"), ("_qk_norm_rope_kernel", "norm_elementwise"),
    ("_activation_quant_kernel", "norm_elementwise"),
    ("some_unknown_kernel", "other"),
])
def test_kernel_names_are_classified(name: str, category: str) -> None:
    assert classify(name) == category


def test_forward_timeline_splits_host_time_idle_gpu_and_busy_gpu() -> None:
    # two forwards (microseconds): host 100 then kernels [100, 300] and [250, 400] (overlapping) and
    # [450, 500]: busy 350, idle 50; the second forward's host takes 300, one kernel of 100
    line = forward_timeline([(0, 600), (1000, 1500)], [(450, 500), (100, 300), (250, 400), (1300, 1400)])
    assert line == {"host_before_first_kernel": 0.2, "idle_between_kernels": 0.025, "busy": 0.225, "span": 0.25}
    assert forward_timeline([(0, 10)], [(50, 60)]) is None  # no device event inside any forward


def test_fp8_linear_tracks_the_bf16_linear_and_drops_its_weight() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(3, 5, 64)
    fp8 = RowwiseFp8Linear(linear)
    reference, output = linear(x), fp8(x)
    cosine = torch.nn.functional.cosine_similarity(output.flatten(), reference.flatten(), dim=0)
    assert output.shape == reference.shape and output.dtype == x.dtype and cosine > 0.99
    assert not any(True for _ in fp8.parameters())  # only fp8 buffers and scales are kept


def test_quantize_replaces_block_linears_only_and_is_idempotent() -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)

    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([Block(), Block()])
    model.head = torch.nn.Linear(32, 32)
    assert quantize_linears(model, min_features=16)[0] == 2
    assert isinstance(model.head, torch.nn.Linear)
    assert quantize_linears(model, min_features=16)[0] == 0
    # the like-for-like baseline row: the same layers with cuBLAS' fast accumulation, and back
    x = torch.randn(4, 32)
    slow = model.blocks[0].proj(x)
    assert set_fast_accum(model, True) == 2 and model.blocks[0].proj.use_fast_accum
    assert "fast accumulation" in repr(model.blocks[0].proj)
    assert torch.allclose(model.blocks[0].proj(x), slow, rtol=1e-2, atol=1e-2)  # the CPU ignores the flag
    assert set_fast_accum(model, False) == 2 and not model.blocks[0].proj.use_fast_accum


def test_model_mutating_variants_run_last() -> None:
    names = [v.name for v in select("fp8,eager,kopt", "full", whole_model=False)]
    assert names == ["eager", "kopt", "fp8+torch.compile"]
    releasing = [v.name for v in select("kopt-regional-fp8-attn,eager,fp8,kopt-regional-fp8-attn-keep-weights",
                                        "full", whole_model=False)]  # kopt's FP8 frees bf16 weights by default
    assert releasing == ["eager", "kopt-regional-fp8-attn-keep-weights", "kopt-regional-fp8-attn", "fp8+torch.compile"]
    assert "torch.compile-full" not in [v.name for v in select("auto", "full", whole_model=False)]
    assert "torch.compile-full" in [v.name for v in select("auto", "full", whole_model=True)]
    tiny_default = [v.name for v in select("auto", "tiny", whole_model=False)]
    assert "kopt-regional" in tiny_default and not any(v.endswith("-keep-weights") for v in tiny_default)
    assert not any("max-autotune" in v for v in tiny_default)
    tuned = [v.name for v in select("kopt-regional-max-autotune,torch.compile-max-autotune+graphs", "full", False)]
    assert tuned == ["kopt-regional-max-autotune", "torch.compile-max-autotune+graphs"]  # neither changes the model


def test_a_model_changed_by_a_variant_is_built_again_with_the_same_weights() -> None:
    """Two model-changing variants in one process: the second gets the model built again from seed 0,
    and a build that came out different would be refused (its references would not apply)."""
    from benchmarks.dit import dit
    from benchmarks.dit.log import Log

    args = dit.parse_args(["--size", "tiny", "--device", "cpu", "--models", "flux2", "--no-ceilings"])
    setup = dit.Setup(size="tiny", device=torch.device("cpu"), dtype=torch.float32)
    run = dit.Run(args, setup, [], Log(), dict(rows=[], per_model={}, models=["flux2"]))
    state = dit.build_state(run, "flux2")
    first = state.model
    before = {k: v.clone() for k, v in first.state_dict().items()}
    assert quantize_linears(first, min_features=16)[0] > 0  # what an FP8 variant leaves behind
    rebuilt = dit.rebuild_model(run, state)
    assert rebuilt.model is not first and state.model is None
    after = rebuilt.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert rebuilt.reference is state.reference
    rebuilt.fingerprint[0] += 1  # a model that does not match the fingerprint is refused
    with pytest.raises(RuntimeError, match="other weights"):
        dit.rebuild_model(run, rebuilt)


def test_stepping_calls_never_repeat_a_timestep_even_in_bf16():
    """Timed calls walk through distinct timestep values (bf16), so a memo cannot hit across steps."""
    from benchmarks.dit.calls import stepping_cfg_pair, stepping_forward
    from kopt.workloads import get_workload

    seen = []
    workload = get_workload("flux2")
    inputs = workload.inputs("tiny", dtype=torch.bfloat16)
    call = stepping_forward(workload, lambda **kw: seen.append(kw["timestep"]), inputs)
    for _ in range(50):
        call()
    assert torch.equal(seen[0], inputs["timestep"])
    assert len({t.item() for t in seen}) == 50
    seen.clear()
    pair = stepping_cfg_pair(workload, lambda **kw: seen.append(kw["timestep"]), inputs, inputs)
    for _ in range(10):
        pair()
    values = [t.item() for t in seen]
    assert values[0::2] == values[1::2] and len(set(values)) == 10


def test_kernel_benchmark_smoke(tmp_path):
    """benchmarks/micro/kernels.py runs every kernel (interpreter on the CPU) and reports its error."""
    from benchmarks.micro.kernels import run

    rows = run("tiny", tmp_path)
    fp8_outputs = {"activation_quant", "adaln_modulation_quant", "gated_residual_quant"}
    assert {r["kernel"] for r in rows} == {"adaln_modulation", "gated_residual", "qk_norm_rope", "qk_norm_rope_joint",
                                           "qk_norm_rope_pair", "gelu_tanh", "swiglu"} | fp8_outputs
    exact = [r for r in rows if r["kernel"] not in fp8_outputs]
    assert all(r["rel_err"] < 1e-2 for r in exact)  # bf16 kernels vs their spec; zeros would give 1.0
    # FP8 output, compared dequantized; Triton's CPU interpreter truncates bf16 and drops fp8 rounding
    # carries (see tests/kernels/test_activation_quant.py), so the bound is loose here and tight on the GPU
    assert [r["rel_err"] < 0.1 for r in rows if r["kernel"] in fp8_outputs] == [True] * 4
    assert all(r["config"] and r["config_source"] == "default" for r in rows)  # no timing on the CPU
    assert (tmp_path / "kernels-tiny.json").exists() and (tmp_path / "kernels-tiny.md").exists()
    assert "num_warps=" in (tmp_path / "kernels-tiny.md").read_text()


def test_fp8_gemm_and_attention_benchmarks_smoke(tmp_path):
    """benchmarks/micro/fp8_gemm.py (every granularity) and benchmarks/micro/attention.py run and report errors."""
    import torch as _torch

    from benchmarks.micro import attention, fp8_gemm

    cpu = _torch.device("cpu")
    gemm_rows = fp8_gemm.run(fp8_gemm.TINY, cpu)
    assert [r["granularity"] for r in gemm_rows] == ["bf16", "tensor", "row", "block-1x128", "block-128x128"]
    assert all(0 < r["rel_err"] < 0.1 for r in gemm_rows)  # FP8-sized errors; zeros would give 1.0
    fp8_gemm.write(gemm_rows, tmp_path, cpu)
    attention_rows = attention.run(attention.TINY, cpu)
    # SDPA, then the FP8 kernel with the mask applied to every key tile and only within its window
    assert [r["kernel"] for r in attention_rows] == ["sdpa bf16", "kopt fp8", "kopt fp8"]
    assert attention_rows[2]["config"].endswith("window=0:20")
    assert all(0 < r["rel_err"] < 0.2 for r in attention_rows)  # the interpreter truncates FP8 rounding
    assert (tmp_path / "fp8-gemm.md").exists()


def test_capped_attention_benchmark_smoke():
    """benchmarks/micro/capped_attention.py times the model's spelled-out attention and the fused kernel and
    reports both errors against float32 (the interpreter truncates bf16 roundings: errors of ~1e-2)."""
    import torch as _torch

    from benchmarks.micro import capped_attention

    rows = capped_attention.measure_shape(*capped_attention.TINY[0], device=_torch.device("cpu"))
    assert [r["kernel"] for r in rows] == ["spelled out, eager", "kopt fused", "kopt fused"]
    assert all(0 < r["rel_err"] < 2e-2 for r in rows)


def test_capped_attention_candidates_are_the_tiles_that_do_not_spill_much():
    """benchmarks/tools/sass.py attention: every tile capped_attention leaves out for a 256-wide head spills
    registers on sm_90, and one it keeps does not spill at all."""
    import os

    from kopt.kernels import capped_attention

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "tools" / "sass.py"
    out = subprocess.run([sys.executable, str(script), "attention", "256"], capture_output=True, text=True, env=env,
                         check=True, timeout=600).stdout
    stores = {}
    for line in out.strip().splitlines()[2:]:
        _, tile, _, _, local_stores = (cell.strip() for cell in line.strip("|").split("|"))
        stores[tile] = int(local_stores)
    kept = {f"{c['BLOCK_M']} x {c['BLOCK_N']}, {c['num_warps']} warps" for c in capped_attention.candidates(256)}
    assert kept < set(stores)
    assert all(stores[tile] > 0 for tile in set(stores) - kept)
    assert any(stores[tile] == 0 for tile in kept)


def test_attention_layout_benchmark_times_every_layout_with_its_strides():
    """benchmarks/micro/attention_layout.py: each layout is what its name says, and the output is attention."""
    from benchmarks.micro import attention_layout

    rows = attention_layout.measure_shape(*attention_layout.TINY[0], device=torch.device("cpu"), backends=("math",))
    strides = {r["layout"]: r["strides"] for r in rows}
    view, dense, merged = [3072, 16, 32, 1], [3072, 1536, 16, 1], [9216, 16, 96, 1]
    assert strides["projection"] == [view] * 3  # (B, H, S, D) over (B, S, H*D)
    assert strides["head-major"] == [dense] * 3
    assert strides["merged-qkv"] == [merged] * 3  # slices of one (B, S, 3*H*D) buffer
    assert strides["merged-v"] == [view, view, merged]
    assert all(0 < r["rel_err"] < 1e-2 and r["ms"] > 0 for r in rows)  # bf16-sized; zeros would give 1.0


def test_floor_report_reads_a_saved_run():
    """benchmarks/dit/floor.py on the committed H200 result the README cites (Qwen-Image ``s7d``): the floor,
    kopt's distance above it, and the idle time between kernels per launch that it quotes."""
    import json

    from benchmarks.dit.floor import report

    text = report(json.loads((RESULTS / "dit-full-qwen-image-s7d.json").read_text()), 1420.0, 3)
    assert "= 78.6 ms" in text and "| kopt-fp8-attn | forward | 92.47 | 13.9 |" in text
    assert "| 14.54 | 5.04 | 5.1 |" in text


def test_clocks_summary_reads_both_nvidia_smi_logs(capsys):
    """benchmarks/tools/clocks.py on committed logs: per-row clocks from a timestamped log with its dit.py log,
    the busy-sample summary alone (the numbers the README quotes)."""
    from benchmarks.tools import clocks

    assert clocks.main([str(RESULTS / "smi-s7d.csv"), str(RESULTS / "log-qwen-image-s7d.txt"), "--gpu", "0"]) == 0
    timed = capsys.readouterr().out
    assert "| row | median ms |" in timed and "| kopt-fp8-attn forward | 92.47 |" in timed
    assert "busy samples (> 300 W): 16" in timed
    assert clocks.main([str(RESULTS / "smi-s6gs6h.csv"), "--gpu", "1", "--busy-watts", "600"]) == 0
    busy = capsys.readouterr().out
    assert "SM clock p10/p50/p90 1410/1485/1665 MHz" in busy


def test_sass_counts_compile_for_sm90_on_the_cpu():
    """benchmarks/tools/sass.py reproduces the counts the kernel docstrings quote: the PTX forms cost fewer
    instructions per value than plain Triton math, and register chunks fewer than one block; the
    register-chunk kernel fits two programs per SM; qk_norm_rope's one-token programs load less.
    (A subprocess: the tests run Triton's interpreter, which compiles nothing.)"""
    import os

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "tools" / "sass.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                         check=True, timeout=600).stdout
    per_value_table, resource_table = out.split("\n\n")
    table = {}
    for line in per_value_table.splitlines()[2:]:
        layout, math, _, per_value = (cell.strip() for cell in line.strip("|").split("|"))
        table[(layout, math)] = float(per_value)
    resources = {}
    for line in resource_table.strip().splitlines()[2:]:
        label, _, _, per_sm, loads = (cell.strip() for cell in line.strip("|").split("|"))
        resources[label] = (int(per_sm), int(loads))
    # the prefix read in pieces leaves room for two programs per SM; a token's RoPE row is loaded once
    assert resources["activation_quant, 5 register chunks of 4096 + 6144 prefix"][0] >= 2
    for mode in ("real", "complex"):
        per_head = resources[f"qk_norm_rope {mode}, 8 rows, table per head"][1]
        once = resources[f"qk_norm_rope {mode}, 8 rows, table once per token"][1]
        assert 0 < once < per_head
    one_block, chunks = "one 16384-wide block, 32 warps", "3 register chunks of 4096, 16 warps"
    assert len(table) == 4
    assert table[(one_block, "PTX forms")] < table[(one_block, "plain Triton")]
    assert table[(chunks, "PTX forms")] < table[(chunks, "plain Triton")]
    assert table[(chunks, "PTX forms")] < table[(one_block, "PTX forms")]


def test_compile_time_reports_each_pass(capsys):
    """benchmarks/dit/compile_time.py times kopt.compile of a deep, tiny-width Qwen-Image per pass."""
    from benchmarks.dit import compile_time

    assert compile_time.main(["--blocks", "2"]) == 0
    out = capsys.readouterr().out
    assert "qwen-image, 2 blocks of tiny width, lower=eager, min_features=1: first call" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert "| applied | 6 |" in rows["fuse-gated-residual"]  # every block boundary of the two blocks
    assert "| applied |" in rows["staging"] and "(all passes)" in rows


def test_stall_probe_reports_state_and_makes_the_process_print_its_stack(tmp_path):
    """benchmarks/tools/stall_probe.sh samples a running process until it exits: its state and wait channel
    (ps), and a SIGUSR1 that a process with faulthandler registered (as dit.py has) answers with its stack."""
    child = tmp_path / "child.py"
    child.write_text("import faulthandler, signal, sys, time\n"
                     "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
                     "print('ready', flush=True)\n"
                     "def waiting_in_a_named_function():\n    time.sleep(3)\n"
                     "waiting_in_a_named_function()\n")
    stderr = tmp_path / "child.err"
    with stderr.open("w") as err:
        process = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, stderr=err, text=True)
        assert process.stdout.readline().strip() == "ready"
        probe_script = REPO / "benchmarks" / "tools" / "stall_probe.sh"
        probe = subprocess.run(["bash", str(probe_script), str(process.pid), "0", "1"],
                               capture_output=True, text=True, timeout=60)
        assert process.wait(timeout=30) == 0  # the signal printed a stack, it did not end the process
    assert probe.returncode == 0, probe.stderr
    assert "=== " in probe.stdout and "STAT" in probe.stdout and str(process.pid) in probe.stdout
    assert "waiting_in_a_named_function" in stderr.read_text()


def test_pipeline_benchmark_runs_a_real_flux_pipeline_eager_and_kopt(tmp_path):
    """benchmarks/dit/pipeline.py's plumbing on the tiny FluxPipeline: both modes make an image, kopt's
    is eager's within bf16 noise, and the memo sees every transformer call (plus the first call's
    lowering check)."""
    from benchmarks.dit.pipeline import main

    main(["--model", "flux1-dev", "--tiny", "--device", "cpu", "--steps", "2", "--size", "64", "--images", "1",
          "--modes", "eager,kopt", "--fp32-reference", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "pipeline-flux1-dev-tiny.json").read_text())
    eager, compiled = result["rows"]
    assert [eager["mode"], compiled["mode"]] == ["eager", "kopt"]
    assert eager["seconds_per_image"] > 0 and compiled["seconds_per_image"] > 0
    assert compiled["rel_err_vs_eager"] < 0.05
    # against the float32 copy of the same pipeline, kopt's image is as close as eager bf16's (zoo bound)
    assert 0 < eager["rel_err_vs_fp32"] and compiled["rel_err_vs_fp32"] <= 1.5 * eager["rel_err_vs_fp32"] + 3.9e-3
    assert compiled["memo_misses"] >= 2  # the warm-up image's two timesteps
    calls = compiled["memo_hits"] + compiled["memo_misses"] + compiled["memo_bypassed"]
    assert calls >= 2 * 2  # warm-up and timed image, 2 steps each
    assert "| kopt |" in (tmp_path / "pipeline-flux1-dev-tiny.md").read_text()


def test_warm_compile_runs_the_variant_again_in_a_fresh_process(tmp_path):
    from benchmarks.dit.warm_compile import in_fresh_process

    log = tmp_path / "log-warm.txt"
    result = in_fresh_process("flux1", "kopt-eager", "tiny", "cpu", "fp32", timeout_s=240, log=log)
    assert "error" not in result, result
    assert result["variant"] == "kopt-eager" and result["compile_s"] > 0 and result["median_ms"] > 0
    assert isinstance(result["caches"], dict)  # Inductor's cache counters (none: kopt-eager lowers no graph)
    assert result["device_memory"] is None  # the allocator's activity is a CUDA device's
    assert result["host"]["cores"] >= 1 and result["host"]["host_available_gb"] > 0
    assert isinstance(result["host"]["settings"], dict)  # the compile-related environment it inherited
    assert "graph 0: capturing" in log.read_text()  # kopt's progress, for where the time went


def test_a_sampled_warm_compile_in_a_fresh_process_logs_where_its_time_went(tmp_path):
    """``dit.py --warm-sample N``: the child samples its stack and its log ends with the report."""
    from benchmarks.dit.warm_compile import in_fresh_process

    log = tmp_path / "log-warm.txt"
    result = in_fresh_process("flux1", "kopt-eager", "tiny", "cpu", "fp32", timeout_s=240, log=log, sample_top=5)
    assert "error" not in result, result
    text = log.read_text()
    assert "==== stack samples ====" in text and "graph 0: capturing" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA caching allocator's counters")
def test_warm_compile_reports_the_allocators_activity_on_a_gpu():
    from benchmarks.dit.warm_compile import allocator_activity, device_free_gb

    device = torch.device("cuda")
    free = device_free_gb(device)
    before = torch.cuda.memory_stats(device).get("num_device_alloc", 0)
    block = torch.empty(256 << 20, dtype=torch.uint8, device=device)  # a new segment: one cudaMalloc at least
    activity = allocator_activity(device, free)
    del block
    assert free is not None and free > 0 and activity["free_gb_before_compile"] == round(free, 2)
    assert activity["device_allocs"] >= before + 1
    assert all(activity[k] >= 0 for k in ("alloc_retries", "device_allocs", "device_frees"))


def test_warm_compile_counts_inductors_cache_lookups():
    """A graph Inductor lowers is looked up in its FX graph cache: a hit, a miss or a bypass is counted."""
    from benchmarks.dit.warm_compile import cache_counters

    before = cache_counters()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: torch.sin(x) * 3 + 1, backend="inductor")
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x), torch.sin(x) * 3 + 1)
    after = cache_counters()
    looked_up = sum(after.get(k, 0) - before.get(k, 0)
                    for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"))
    assert looked_up >= 1, (before, after)


def test_warm_compile_is_measured_for_the_variants_named_and_never_for_eager():
    from benchmarks.dit.dit import wants_warm_compile

    assert not wants_warm_compile(None, "kopt-regional")
    assert wants_warm_compile("all", "kopt-regional") and not wants_warm_compile("all", "eager")
    chosen = "kopt-regional, kopt-regional-fp8-attn"
    assert wants_warm_compile(chosen, "kopt-regional-fp8-attn")
    assert not wants_warm_compile(chosen, "torch.compile+graphs")
    assert not wants_warm_compile(chosen, "kopt-regional-fp8")  # names, not prefixes


def test_the_parent_keeps_its_model_off_cuda_during_a_warm_compile():
    from benchmarks.dit.warm_compile import needs_the_device_alone, two_copies_fit

    model = torch.nn.Linear(1823, 781)
    assert not needs_the_device_alone(model, torch.device("cpu"))
    h200 = 150_000_000_000  # bytes, as torch reports an H200's memory (about 140 GiB)
    assert not two_copies_fit(64_400_000_000, h200)  # FLUX.2's bf16 transformer
    assert two_copies_fit(24_000_000_000, h200)  # FLUX.1's


def test_trace_gaps_attributes_gpu_idle_to_the_host_work_beside_it():
    from benchmarks.tools.trace_gaps import gaps

    def event(cat, name, ts, dur, tid=1):
        return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "ph": "X"}

    events = [event("user_annotation", "kopt_breakdown_forward_0", 0.0, 1000.0),
              event("cpu_op", "aten::copy_", 5.0, 30.0), event("cpu_op", "aten::_to_copy", 10.0, 5.0),
              event("kernel", "first", 40.0, 100.0, tid=7), event("cpu_op", "cudaStreamSynchronize", 150.0, 300.0),
              event("kernel", "after_sync", 500.0, 100.0, tid=7), event("kernel", "close", 605.0, 10.0, tid=7)]
    result = gaps(events, min_us=20.0)
    assert result["host_before_first_kernel_us"] == 40.0
    (gap,) = result["gaps"]  # 140 -> 500; the 5 us gap before "close" is below the threshold
    assert gap["idle_us"] == 360.0 and gap["next_kernel"] == "after_sync"
    assert gap["host"] == [("cudaStreamSynchronize", 300.0)]
    assert result["idle_by_host_op_us"] == {"cudaStreamSynchronize": 360.0}


def test_host_profile_prints_the_call_path_by_cumulative_time(tmp_path, monkeypatch, capsys):
    from benchmarks.tools.host_profile import main

    monkeypatch.setenv("OUT", str(tmp_path))
    main(["--model", "flux1", "--variant", "kopt-eager", "--size", "tiny", "--device", "cpu", "--calls", "2"])
    report = (tmp_path / "host-profile-flux1-kopt-eager.txt").read_text()
    assert "2 synchronised calls" in report and "compiled_graph.py" in report
    assert "ms per call" in capsys.readouterr().out


def test_a_profiled_warm_compile_names_where_its_time_went(capsys):
    """``warm_compile.py --profile N``: the block's costliest functions by cumulative and own time on
    stderr; N = 0 profiles nothing."""
    from benchmarks.dit.warm_compile import profiled

    def _spends_time_in_a_named_helper():
        return sum(i * i for i in range(200_000))

    with profiled(40):
        _spends_time_in_a_named_helper()
    err = capsys.readouterr().err
    assert "most cumulative time" in err and "most own time" in err
    assert "_spends_time_in_a_named_helper" in err
    with profiled(0):
        _spends_time_in_a_named_helper()
    assert capsys.readouterr().err == ""


def test_a_failing_launch_config_is_a_row_with_its_error_and_the_table_goes_on():
    """benchmarks/micro/harness.py: a config that raises gives a row with its reason and no numbers."""
    import torch as _torch

    from benchmarks.micro import harness

    def broken():
        raise RuntimeError("out of resources: shared memory\nmore")

    label = dict(model="m", shape="s")
    row = harness.timed_row(label, "kernel", "cfg", broken, None, 1, _torch.device("cpu"))
    assert row["error"] == "out of resources: shared memory" and row["ms"] is None
    x = _torch.randn(8, 8)
    good = harness.timed_row(label, "kernel", "cfg", lambda: x * 2, x.double() * 2, 64, _torch.device("cpu"))
    assert good["rel_err"] == 0.0 and good["ms"] > 0
    lines = harness.kernel_table([row, good])
    assert lines[0].endswith("| failed: out of resources: shared memory | – | – |")
    assert all(line.count("|") == harness.KERNEL_HEADER[0].count("|") for line in lines)  # the table's columns
    assert "| 0.00e+00 |" in lines[1]


def test_compiled_model_accuracy_compares_each_configuration_and_eager_after_the_undo():
    """benchmarks/tools/compiled_model_accuracy.py on tiny Gemma 2 (CPU): FP8 takes the linears, every
    call is compared with the reference, and eager after the undo is eager before it."""
    from benchmarks.tools.compiled_model_accuracy import run

    rows = run("gemma2", "tiny", ["fp8 regional linears eager-lowering"])
    row = rows["fp8 regional linears eager-lowering"]
    assert "error" not in row and row["fp8_linears"] > 0 and len(row["calls"]) == 3
    assert all(c["finite"] and 0 < c["rel"] < 0.5 and c["cos"] > 0.9 for c in row["calls"])
    assert row["calls"][0]["rel"] > rows["eager"]["rel"]  # FP8 rounds more than bf16
    assert row["eager_after_undo"] == rows["eager"]
