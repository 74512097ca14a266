"""Seconds per image of a real diffusers pipeline with a full-size transformer: eager vs diffusers'
``compile_repeated_blocks`` vs ``kopt.optimize_pipeline``, with kopt's step-invariant memo hit rate.

    python benchmarks/dit/pipeline.py --model qwen-image --steps 28     # one model per 10-minute GPU call
    python benchmarks/dit/pipeline.py --model flux1-dev --tiny --device cpu --steps 2 --size 64   # plumbing check

The transformer is the published configuration (Qwen-Image 20B, or FLUX.1-dev 12B) with random
weights in bf16 on the GPU, inside the stock ``QwenImagePipeline`` / ``FluxPipeline``; text
encoders and VAE are tiny models of the right widths (they run once per image). Qwen-Image runs
true CFG (``true_cfg_scale=4`` with a negative prompt: two transformer calls per step, which share
one evaluation of kopt's memo); FLUX.1-dev is guidance-distilled (one call per step). 1024x1024.

Each mode: a warm-up image (compiles; its time is the compile cost), then ``--images`` timed images
on fresh pipelines of the same weights. Writes ``pipeline-<model>.json`` and ``.md`` under ``$OUT``
(or ``benchmarks/results``); the images' relative error against eager's is in both, and with
``--fp32-reference`` against a float32 copy of the same pipeline. ``--tiny``
swaps in the test suite's tiny pipelines (every component tiny): the CPU check of this script's
plumbing, not a measurement.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kopt  # noqa: E402
from benchmarks.dit.breakdown import profile_breakdown  # noqa: E402
from tests.integrations.tiny_pipelines import byte_tokenizer, flow_match_scheduler  # noqa: E402

FLUX1_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                 num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                 axes_dims_rope=(16, 56, 56))
PROMPT = "a red cube on a wooden table, studio light, high detail"


def flux_pipeline(device: str, dtype: torch.dtype):
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    clip_tokenizer = byte_tokenizer(("<|endoftext|>",), 77, "<|endoftext|>")
    t5_tokenizer = byte_tokenizer(("<pad>", "</s>"), 512, "<pad>", eos="</s>")
    with torch.device(device):
        torch.set_default_dtype(dtype)
        try:
            transformer = FluxTransformer2DModel(**FLUX1_DEV).eval()
            clip = CLIPTextModel(CLIPTextConfig(vocab_size=len(t5_tokenizer), hidden_size=768, intermediate_size=64,
                                                num_hidden_layers=1, num_attention_heads=12, eos_token_id=2)).eval()
            t5 = T5EncoderModel(T5Config(vocab_size=len(t5_tokenizer), d_model=4096, d_kv=64, d_ff=64,
                                         num_layers=1, num_heads=4)).eval()
            vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                                block_out_channels=(8, 8, 8, 8), layers_per_block=1, latent_channels=16,
                                norm_num_groups=4, shift_factor=0.0609, scaling_factor=0.3611,
                                use_quant_conv=False, use_post_quant_conv=False).eval()
        finally:
            torch.set_default_dtype(torch.float32)
    pipe = FluxPipeline(scheduler=flow_match_scheduler(), vae=vae, text_encoder=clip, tokenizer=clip_tokenizer,
                        text_encoder_2=t5, tokenizer_2=t5_tokenizer, transformer=transformer)
    return pipe, dict(guidance_scale=3.5, max_sequence_length=512)


def qwen_image_pipeline(device: str, dtype: torch.dtype):
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from kopt.workloads import get_workload

    tokenizer = byte_tokenizer(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), 1024, "<|endoftext|>")
    transformer = get_workload("qwen-image").model("full", device=device, dtype=dtype).eval()
    with torch.device(device):
        torch.set_default_dtype(dtype)
        try:
            text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
                text_config=dict(vocab_size=len(tokenizer), hidden_size=3584, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=28, num_key_value_heads=4,
                                 rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                                 rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24]}),
                vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=3584,
                                   patch_size=2, spatial_merge_size=2, temporal_patch_size=2, window_size=4,
                                   fullatt_block_indexes=[0]),
                vocab_size=len(tokenizer))).eval()
            vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1).eval()
        finally:
            torch.set_default_dtype(torch.float32)
    pipe = QwenImagePipeline(scheduler=flow_match_scheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tokenizer, transformer=transformer)
    return pipe, dict(negative_prompt=" ", true_cfg_scale=4.0)


def tiny_pipeline(model: str, device: str, dtype: torch.dtype):
    """The test suite's tiny pipeline of ``model`` (every component tiny), on ``device``."""
    from tests.integrations.tiny_pipelines import tiny_flux_pipeline, tiny_qwen_image_pipeline

    if model == "qwen-image":
        return tiny_qwen_image_pipeline().to(device, dtype), dict(negative_prompt=" ", true_cfg_scale=4.0)
    return tiny_flux_pipeline().to(device, dtype), dict(guidance_scale=3.5, max_sequence_length=32)


def fp32_image(pipe, arguments: dict, steps: int, size: int, seed: int) -> torch.Tensor:
    """The image a float32 copy of ``pipe`` (the same weights, upcast) makes for ``seed``: the
    higher-precision reference every mode's image is compared with."""
    upcast = copy.deepcopy(pipe).to(torch.float32)
    image, _ = generate(upcast, arguments, steps, size, seed)
    del upcast
    return image


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def generate(pipe, arguments: dict, steps: int, size: int, seed: int) -> tuple[torch.Tensor, float]:
    device = str(pipe.transformer.device)
    _synchronize(device)
    start = time.perf_counter()
    with torch.no_grad():
        image = pipe(prompt=PROMPT, num_inference_steps=steps, height=size, width=size, output_type="pt",
                     generator=torch.Generator(device).manual_seed(seed), **arguments).images
    _synchronize(device)
    return image.float(), time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("qwen-image", "flux1-dev"), default="qwen-image")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--images", type=int, default=2, help="timed images per mode (after the warm-up)")
    parser.add_argument("--modes", default="eager,regional,kopt")
    parser.add_argument("--fp8", action="store_true", help="kopt with fp8=True (an extra mode, kopt-fp8)")
    parser.add_argument("--tiny", action="store_true", help="every component tiny (a plumbing check)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="per mode, profile one image of this many steps: GPU kernel time against wall time "
                             "and idle GPU time (0: off)")
    parser.add_argument("--trace", action="store_true", help="with --profile-steps: also a gzipped Chrome trace")
    parser.add_argument("--fp32-reference", action="store_true",
                        help="also make the last timed image with a float32 copy of the same pipeline and report "
                             "each mode's relative error against it (eager bf16 is not the truth)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None, help="results folder (default: $OUT, else benchmarks/results)")
    args = parser.parse_args(argv)
    out = Path(args.out or os.environ.get("OUT") or Path(__file__).resolve().parents[1] / "results")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if args.tiny:
        pipe, arguments = tiny_pipeline(args.model, args.device, torch.bfloat16)
    else:
        build = qwen_image_pipeline if args.model == "qwen-image" else flux_pipeline
        pipe, arguments = build(args.device, torch.bfloat16)
    modes = args.modes.split(",") + (["kopt-fp8"] if args.fp8 else [])
    rows, reference = [], None
    fp32 = fp32_image(pipe, arguments, args.steps, args.size, seed=args.images) if args.fp32_reference else None
    for mode in modes:
        torch._dynamo.reset()
        if mode == "regional":
            pipe.transformer.compile_repeated_blocks(fullgraph=True)
        elif mode.startswith("kopt"):
            kopt.optimize_pipeline(pipe, fp8=True if mode == "kopt-fp8" else None, progress=True)
        _, warmup = generate(pipe, arguments, args.steps, args.size, seed=0)
        times, image = [], None
        for index in range(args.images):
            image, seconds = generate(pipe, arguments, args.steps, args.size, seed=1 + index)
            times.append(seconds)
        reference = image if reference is None else reference
        error = ((image - reference).norm() / reference.norm()).item()
        row = dict(mode=mode, seconds_per_image=min(times), all_seconds=times, warmup_seconds=warmup,
                   rel_err_vs_eager=error)
        if fp32 is not None:
            row["rel_err_vs_fp32"] = ((image - fp32).norm() / fp32.norm()).item()
        if args.profile_steps:
            trace = out / f"trace-pipeline-{args.model}-{mode}.json.gz" if args.trace else None
            profiled = profile_breakdown(lambda: generate(pipe, arguments, args.profile_steps, args.size, seed=99),
                                         torch.device(args.device), forwards=1, trace=trace)
            row["profile"] = dict(steps=args.profile_steps, kernel_ms=profiled["kernel_ms"],
                                  launches=profiled["launches"], timeline=profiled["timeline"], ms=profiled["ms"])
        if mode.startswith("kopt"):
            memo = pipe.kopt.memo
            graphs = len(pipe.kopt.reports["transformer"].graphs)
            row.update(memo_hits=memo.hits, memo_misses=memo.misses, memo_bypassed=memo.bypassed, graphs=graphs,
                       padded_calls=pipe.kopt.padded_calls)
            pipe.kopt.restore()
        elif mode == "regional":
            for module in pipe.transformer.modules():
                module._compiled_call_impl = None
        rows.append(row)
        print(json.dumps(row), flush=True)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    result = dict(model=args.model, steps=args.steps, size=args.size, gpu=device_name, tiny=args.tiny,
                  torch=torch.__version__, kopt=kopt.__version__, rows=rows)
    stem = f"pipeline-{args.model}" + ("-tiny" if args.tiny else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    lines = [f"# {args.model} pipeline, {args.size}x{args.size}, {args.steps} steps, {result['gpu']}", "",
             "| mode | s / image | warm-up (compile) s | rel err vs eager | rel err vs fp32 | memo hits / calls "
             "| profiled image: kernel s / idle GPU s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        memo = (f"{row['memo_hits']} / {row['memo_hits'] + row['memo_misses'] + row['memo_bypassed']}"
                if "memo_hits" in row else "–")
        fp32_error = f"{row['rel_err_vs_fp32']:.4f}" if "rel_err_vs_fp32" in row else "–"
        profiled = row.get("profile") or {}
        timeline = profiled.get("timeline")
        gpu = (f"{profiled['kernel_ms'] / 1e3:.2f} / {timeline['idle_between_kernels'] / 1e3:.2f} "
               f"({profiled['steps']} steps)" if timeline else "–")
        lines.append(f"| {row['mode']} | {row['seconds_per_image']:.2f} | {row['warmup_seconds']:.1f} | "
                     f"{row['rel_err_vs_eager']:.4f} | {fp32_error} | {memo} | {gpu} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
