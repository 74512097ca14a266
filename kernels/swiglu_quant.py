"""SwiGLU + row-wise FP8 quantization in one kernel, optionally behind a prefix: the input of an FP8
down projection.

    y   = cat([prefix, silu(h[:, :F]) * h[:, F:]], dim=-1)      (M, P + F), rounded to h.dtype
    q   = clamp(y / scale, ±448).to(float8_e4m3fn),  scale = max(amax(|y|, -1), 1e-12) / 448

FLUX.2's single-stream blocks feed ``cat([attention output, SwiGLU(mlp)])`` to one output
projection, and its feed-forwards feed ``SwiGLU(h)`` to the down projection. Unfused (Inductor on
the quantized graph) that is one kernel computing the row amax and a second one recomputing y and
writing q: the (M, 2F) bf16 input, 340 MB per FLUX.2 block, is read twice from DRAM. Here one
program owns one row and makes both passes over it back to back, so the second read of the row
(≈ 85 KB) comes from L2.

Numerics equal the unfused graph's: silu(g) and the product are rounded to h.dtype as the bf16
graph rounds them, then quantized exactly like :func:`kopt.fp8.quantize.quantize` (ROW).

Bytes moved (memory floor): read ``M * (P + 2F) * e``, write ``M * (P + F)`` (fp8) + ``4 * M``.
FLUX.2 single-stream block, M = 4608, P = 6144, F = 18432, bf16: 396 MB + 113 MB ≈ 0.12 ms at 4.2 TB/s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kopt.fp8.quantize import FP8, FP8_MAX, MIN_AMAX

__all__ = ["launch", "reference", "swiglu_quant"]
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def reference(h: torch.Tensor, prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager spec: the unfused graph's SwiGLU (in h.dtype), cat, then row-wise FP8 quantization."""
    f = h.shape[-1] // 2
    y = torch.nn.functional.silu(h[..., :f]) * h[..., f:]
    if prefix is not None:
        y = torch.cat([prefix, y], dim=-1)
    y = y.reshape(-1, y.shape[-1]).float()
    scale = y.abs().amax(dim=-1, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    return (y / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


@triton.jit
def _swiglu_quant_kernel(prefix_ptr, h_ptr, q_ptr, scale_ptr, P, F, stride_p, stride_h, stride_q,
                         HAS_PREFIX: tl.constexpr, BLOCK: tl.constexpr, P_CHUNKS: tl.constexpr,
                         F_CHUNKS: tl.constexpr):
    # The trip counts are constexpr (one compile per width): Triton's CPU interpreter cannot loop to a
    # runtime bound, and a model has only a few distinct widths.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    dtype = h_ptr.dtype.element_ty
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    # pass 1: the row's amax (prefix, then SwiGLU rounded as the unfused graph rounds it)
    if HAS_PREFIX:
        for chunk in range(0, P_CHUNKS):
            start = chunk * BLOCK
            mask = start + cols < P
            x = tl.load(prefix_ptr + row * stride_p + start + cols, mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
    for chunk in range(0, F_CHUNKS):
        start = chunk * BLOCK
        mask = start + cols < F
        g = tl.load(h_ptr + row * stride_h + start + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(h_ptr + row * stride_h + F + start + cols, mask=mask, other=0.0).to(tl.float32)
        s = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
        y = (s * u).to(dtype).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(y))
    scale = tl.maximum(tl.max(amax, axis=0), 1e-12) / 448.0
    tl.store(scale_ptr + row, scale)
    # pass 2: the same values again (this row is still in L2), quantized
    if HAS_PREFIX:
        for chunk in range(0, P_CHUNKS):
            start = chunk * BLOCK
            mask = start + cols < P
            x = tl.load(prefix_ptr + row * stride_p + start + cols, mask=mask, other=0.0).to(tl.float32)
            q = tl.minimum(tl.maximum(x / scale, -448.0), 448.0)
            tl.store(q_ptr + row * stride_q + start + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    for chunk in range(0, F_CHUNKS):
        start = chunk * BLOCK
        mask = start + cols < F
        g = tl.load(h_ptr + row * stride_h + start + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(h_ptr + row * stride_h + F + start + cols, mask=mask, other=0.0).to(tl.float32)
        s = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)
        y = (s * u).to(dtype).to(tl.float32)
        q = tl.minimum(tl.maximum(y / scale, -448.0), 448.0)
        tl.store(q_ptr + row * stride_q + P + start + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """(M, width) view with unit last-dim stride (a copy only if the last dim is strided)."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def launch(h: torch.Tensor, prefix: torch.Tensor | None = None, block: int = 1024,
           num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel: (q (M, P + F) float8_e4m3fn, scale (M, 1) float32), M = rows of h."""
    if h.dtype not in _DTYPES or h.shape[-1] % 2:
        raise ValueError(f"swiglu_quant: h must be a float tensor with an even last dim, got {h.dtype} "
                         f"{tuple(h.shape)}")
    h2 = _rows(h, "h")
    m, f = h2.shape[0], h2.shape[1] // 2
    p = 0
    if prefix is not None:
        if prefix.dtype != h.dtype or prefix.shape[:-1] != h.shape[:-1] or prefix.device != h.device:
            raise ValueError(f"swiglu_quant: prefix {prefix.dtype} {tuple(prefix.shape)} must match h "
                             f"{h.dtype} {tuple(h.shape)} in dtype, device and all but the last dim")
        prefix = _rows(prefix, "prefix")
        p = prefix.shape[1]
    q = torch.empty((m, p + f), dtype=FP8, device=h.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=h.device)
    if m:
        _swiglu_quant_kernel[(m,)](prefix if prefix is not None else h2, h2, q, scale, p, f,
                                   prefix.stride(0) if prefix is not None else 0, h2.stride(0), q.stride(0),
                                   HAS_PREFIX=prefix is not None, BLOCK=block, P_CHUNKS=triton.cdiv(p, block),
                                   F_CHUNKS=triton.cdiv(f, block), num_warps=num_warps)
    return q, scale


@torch.library.custom_op("kopt::swiglu_quant", mutates_args=())
def swiglu_quant(h: torch.Tensor, prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise FP8 ``cat([prefix, silu(h1) * h2])`` and its scales; Triton on CUDA, the reference elsewhere."""
    if h.is_cuda:
        return launch(h, prefix)
    q, scale = reference(h, prefix)
    return q.contiguous(), scale.contiguous()


@swiglu_quant.register_fake
def _(h, prefix=None):
    m = h.numel() // h.shape[-1]
    width = h.shape[-1] // 2 + (prefix.shape[-1] if prefix is not None else 0)
    return h.new_empty((m, width), dtype=FP8), h.new_empty((m, 1), dtype=torch.float32)
