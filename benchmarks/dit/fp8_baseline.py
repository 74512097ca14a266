"""The FP8 baseline a user would write by hand: dynamic rowwise FP8 linears via ``torch._scaled_mm``.

Every large ``nn.Linear`` inside the transformer blocks becomes a :class:`RowwiseFp8Linear`:

* weight: per-output-channel scale ``amax(|W|, dim=1) / 448``, quantized to ``float8_e4m3fn`` ONCE
  at replacement time, and the bf16 weight is dropped (FLUX.2 is ~64 GB in bf16; keeping both
  copies is what the layer-by-layer replacement avoids);
* activation: per-row (per-token) scale ``amax(|x|, dim=-1) / 448`` computed on every call;
* ``torch._scaled_mm(x_fp8, w_fp8.t(), scale_a=(N, 1) fp32, scale_b=(1, OUT) fp32, bias=bf16,
  out_dtype=bf16)``: the rowwise-scaled FP8 GEMM (CUTLASS/cuBLASLt on Hopper).

Where rowwise ``_scaled_mm`` is unavailable (some CPU builds), the module computes the same
quantized math with an explicit dequantize + matmul reference, and says so in its ``note``.
This is the benchmark's baseline, not a kopt pass: it is deliberately the obvious implementation.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
_TINY = 1e-12  # keeps all-zero rows from dividing by zero


@functools.cache
def scaled_mm_rowwise_support(device_type: str) -> str | None:
    """None when rowwise ``_scaled_mm`` with a bf16 bias runs on ``device_type``, else the reason."""
    device = torch.device(device_type)
    try:
        a = torch.randn(16, 32, device=device).to(FP8)
        b = torch.randn(16, 32, device=device).to(FP8)
        torch._scaled_mm(a, b.t(), scale_a=torch.ones(16, 1, device=device),
                         scale_b=torch.ones(1, 16, device=device),
                         bias=torch.zeros(16, device=device, dtype=torch.bfloat16),
                         out_dtype=torch.bfloat16)
        return None
    except Exception as error:  # noqa: BLE001 - any failure means "use the reference"
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_fp8, scale) with ``x ≈ x_fp8 * scale`` and one float32 scale per row, shape (rows, 1)."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=_TINY) / FP8_MAX
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class RowwiseFp8Linear(nn.Module):
    """``y = x @ W.T + b`` with per-token activation scales and per-output-channel weight scales."""

    def __init__(self, linear: nn.Linear, *, use_scaled_mm: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight_fp8, weight_scale = quantize_rows(linear.weight.detach())
        self.register_buffer("weight_fp8", weight_fp8)  # (OUT, IN) row-major: .t() is column-major
        self.register_buffer("weight_scale", weight_scale.t().contiguous())  # (1, OUT) float32
        bias = linear.bias.detach().to(torch.bfloat16) if linear.bias is not None else None
        self.register_buffer("bias", bias)
        self.use_scaled_mm = use_scaled_mm
        self.use_fast_accum = False  # cuBLAS' fast FP8 accumulation (set_fast_accum); torch's default is off

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leading = x.shape[:-1]
        x_fp8, x_scale = quantize_rows(x.reshape(-1, self.in_features))
        if self.use_scaled_mm:
            y = torch._scaled_mm(x_fp8, self.weight_fp8.t(), scale_a=x_scale, scale_b=self.weight_scale,
                                 bias=self.bias, out_dtype=torch.bfloat16, use_fast_accum=self.use_fast_accum)
        else:
            y = self.dequantized_matmul(x_fp8, x_scale)
        return y.reshape(*leading, self.out_features).to(x.dtype)

    def dequantized_matmul(self, x_fp8: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        """The same quantized math without ``_scaled_mm``: dequantize both sides, fp32 matmul."""
        x = x_fp8.float() * x_scale
        weight = self.weight_fp8.float() * self.weight_scale.t()
        y = x @ weight.t()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(torch.bfloat16)

    def extra_repr(self) -> str:
        kernel = "_scaled_mm rowwise" if self.use_scaled_mm else "dequantize+matmul reference"
        kernel += ", fast accumulation" if self.use_fast_accum else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {kernel}"


def transformer_blocks(model: nn.Module) -> Iterator[nn.Module]:
    """The repeated blocks: diffusers' ``_repeated_blocks`` class names, else every ModuleList item."""
    names = set(getattr(model, "_repeated_blocks", None) or ())
    if names:
        yield from (m for m in model.modules() if type(m).__name__ in names)
        return
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            yield from module


def is_large(linear: nn.Linear, min_features: int) -> bool:
    """Worth FP8 and legal for ``_scaled_mm``: both dims >= ``min_features`` and multiples of 16."""
    dims = (linear.in_features, linear.out_features)
    return all(d >= min_features and d % 16 == 0 for d in dims)


def _device_type(model: nn.Module) -> str:
    for tensor in [*model.parameters(), *model.buffers()][:1]:
        return tensor.device.type
    return "cpu"


def quantize_linears(model: nn.Module, *, min_features: int = 1024) -> tuple[int, list[str]]:
    """Replace large linears inside the transformer blocks, in place, one layer at a time.

    The original linear (and so its bf16 weight) is released as soon as its replacement is set,
    and the CUDA cache is trimmed after every block, so peak memory stays near the bf16 model's.
    Idempotent: already-replaced layers are left alone. Returns (layers replaced, notes).
    """
    device_type = _device_type(model)
    reason = scaled_mm_rowwise_support(device_type)
    replaced = 0
    for block in transformer_blocks(model):
        targets = [name for name, m in block.named_modules()
                   if isinstance(m, nn.Linear) and is_large(m, min_features)]
        for name in targets:
            parent_name, _, child = name.rpartition(".")
            parent = block.get_submodule(parent_name) if parent_name else block
            setattr(parent, child, RowwiseFp8Linear(getattr(parent, child), use_scaled_mm=reason is None))
            replaced += 1
        if device_type == "cuda":
            torch.cuda.empty_cache()
    notes = [f"{replaced} linears -> rowwise FP8 (min_features={min_features})"]
    if reason is not None:
        notes.append(f"rowwise torch._scaled_mm unavailable on {device_type} ({reason}); "
                     "ran the dequantize+matmul reference instead")
    return replaced, notes


def set_fast_accum(model: nn.Module, fast: bool) -> int:
    """Turn cuBLAS' fast FP8 accumulation on or off in every :class:`RowwiseFp8Linear`; returns how many."""
    layers = [m for m in model.modules() if isinstance(m, RowwiseFp8Linear)]
    for layer in layers:
        layer.use_fast_accum = fast
    return len(layers)


def count_fp8_linears(model: nn.Module) -> int:
    """How many :class:`RowwiseFp8Linear` the model holds (reused when a second FP8 variant runs)."""
    return sum(isinstance(m, RowwiseFp8Linear) for m in model.modules())
