"""Whether FP8 on an LLM's LM head alone keeps the model's output within the FP8 quality gate, on the CPU.

FP8 in Llama-3.1-8B's blocks fails the model-level gate on random weights (the error one block adds
grows about tenfold over the 31 after it); the LM head's error reaches the logits directly. This
runs the published configuration's widths and vocabulary with fewer layers (``--layers``), the LM
head's GEMM on the values an FP8 GEMM with per-row scales multiplies (``kopt.fp8.quantize.fake_quantize``
of the activation and the weight, float32 accumulation), and judges the logits against the float32
reference with the gate :class:`kopt.fp8.Fp8Config` uses (``kopt.verify.compare``). Fewer layers
make eager bf16's own error, the base of the gate's bound, smaller than the full model's (0.065),
so a pass here is conservative. Writes JSON.

    python -m benchmarks.tools.lm_head_fp8_gate --layers 2 --tokens 256 \
        --out benchmarks/results/lm-head-fp8-gate-cpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    import transformers

    from kopt.fp8.config import Fp8Config, Granularity
    from kopt.fp8.quantize import Operand, fake_quantize
    from kopt.passes.base import Contract
    from kopt.reference import reference_forward
    from kopt.verify import compare
    from kopt.workloads import llm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama", choices=[f.name for f in llm.FAMILIES])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    family = next(f for f in llm.FAMILIES if f.name == args.family)
    config = llm._config(family, "full")
    config.num_hidden_layers = args.layers
    torch.manual_seed(args.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
    finally:
        torch.set_default_dtype(previous)
    ids = torch.randint(0, config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(args.seed + 1))
    call = dict(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, return_dict=False)
    head = model.get_output_embeddings()
    weight = fake_quantize(head.weight.float(), Granularity.ROW, Operand.WEIGHT)

    def fp8_head(x: torch.Tensor) -> torch.Tensor:
        return (fake_quantize(x.float(), Granularity.ROW, Operand.ACTIVATION) @ weight.t()).to(x.dtype)

    began = time.perf_counter()
    with torch.no_grad():
        eager = model(**call)[0]
        reference = reference_forward(model, **call)[0]
        original = head.forward
        head.forward = fp8_head
        try:
            quantized = model(**call)[0]
        finally:
            head.forward = original
    gate = Fp8Config().gate
    (check,) = compare(quantized, eager, Contract.quality(gate.min_cosine, gate.max_rel_err), reference=reference)
    result = {"model": f"{family.published} config, {args.layers} of {llm._config(family, 'full').num_hidden_layers} "
                       f"layers, random weights", "tokens": args.tokens, "device": "cpu",
              "variant": "FP8 row scales on the LM head alone (emulated: fake-quantized operands, fp32 accumulation)",
              "passes_gate": check.ok, "rel_err": check.rel_err, "cosine": check.cosine,
              "eager_bf16_rel_err": check.baseline_rel_err, "verdict": check.verdict,
              "seconds": time.perf_counter() - began,
              "command": f"python -m benchmarks.tools.lm_head_fp8_gate --family {args.family} --layers {args.layers} "
                         f"--tokens {args.tokens} --out {args.out}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
