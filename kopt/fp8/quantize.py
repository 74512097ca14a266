"""FP8 quantization, the one definition every FP8 piece of kopt uses (pass, scan, kernels, tests).

``x ≈ q * scale`` with ``q = clamp(x / scale, ±448)`` in ``float8_e4m3fn`` and
``scale = max(amax(|x|), 1e-12) / 448`` over each group of the granularity: the whole tensor, each
row of the last dim, or each ``rows × cols`` block of a 2-D tensor (:func:`block_shape`). The amax
maps to the largest finite e4m3 value, so nothing saturates; the floor keeps an all-zero group from
dividing by zero.
"""

from __future__ import annotations

import enum

import torch

from kopt.fp8.config import Granularity

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_AMAX = 1e-12
BLOCK = 128  # the K-extent of one block scale (DeepSeek-V3's recipe; what Hopper's block-scaled GEMMs take)


class Operand(enum.Enum):
    """Which side of ``x @ W.T`` a tensor is: block recipes scale the two differently."""

    ACTIVATION = "activation"
    WEIGHT = "weight"


def block_shape(granularity: Granularity, operand: Operand) -> tuple[int, int] | None:
    """(rows, cols) of one scale's block for the block granularities, None for tensor / row.

    ``block-1x128``: 1×128 for both operands (per token / per output channel, per 128 inputs).
    ``block-128x128``: 1×128 activations, 128×128 weights (DeepSeek-V3): one weight scale per tile.
    """
    if granularity is Granularity.BLOCK_1X128:
        return (1, BLOCK)
    if granularity is Granularity.BLOCK_128X128:
        return (1, BLOCK) if operand is Operand.ACTIVATION else (BLOCK, BLOCK)
    return None


def _scale(amax: torch.Tensor) -> torch.Tensor:
    return amax.clamp(min=MIN_AMAX) / FP8_MAX


def _cast(xf: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


CHUNK_ELEMENTS = 1 << 27  # rows are quantized in slices of about this many elements (512 MiB in float32)


def quantize(x: torch.Tensor, granularity: Granularity, operand: Operand = Operand.ACTIVATION
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) in float32: scale is 0-dim for TENSOR, (rows, 1) for ROW, and for the block
    granularities (ceil(rows / br), cols / bc) over a 2-D ``x`` (the last row block may be short).

    A large 2-D tensor (a merged weight: Qwen-Image's 120 modulation linears are one 6.8 G-element
    matrix) is quantized a slice of rows at a time, so the float32 temporaries stay ~512 MiB
    instead of several times the tensor; every group lies within one slice, so the result is the same."""
    block = block_shape(granularity, operand)
    if granularity is not Granularity.TENSOR and x.dim() == 2 and x.numel() > CHUNK_ELEMENTS:
        step = max(1, CHUNK_ELEMENTS // x.shape[1])
        if block is not None:
            step = max(block[0], step // block[0] * block[0])
        parts = [_quantize_whole(x[start:start + step], granularity, block)
                 for start in range(0, x.shape[0], step)]
        return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])
    return _quantize_whole(x, granularity, block)


def _quantize_whole(x: torch.Tensor, granularity: Granularity, block: tuple[int, int] | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    xf = x.float()
    if block is not None:
        return _quantize_blocks(xf, *block)
    if granularity is Granularity.ROW:
        scale = _scale(xf.abs().amax(dim=-1, keepdim=True))
    elif granularity is Granularity.TENSOR:
        scale = _scale(xf.abs().amax())
    else:
        raise NotImplementedError(f"granularity {granularity.value}")
    return _cast(xf, scale), scale


def _quantize_blocks(xf: torch.Tensor, block_rows: int, block_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    if xf.dim() != 2 or xf.shape[1] % block_cols:
        raise ValueError(f"block quantization needs a 2-D tensor whose columns divide by {block_cols}, "
                         f"got {tuple(xf.shape)}")
    rows, cols = xf.shape
    padded_rows = -(-rows // block_rows) * block_rows
    padded = torch.nn.functional.pad(xf, (0, 0, 0, padded_rows - rows)) if padded_rows != rows else xf
    tiles = padded.reshape(padded_rows // block_rows, block_rows, cols // block_cols, block_cols)
    scale = _scale(tiles.abs().amax(dim=(1, 3)))
    return _cast(xf, expand_scale(scale, rows, cols, block_rows)), scale


def expand_scale(scale: torch.Tensor, rows: int, cols: int, block_rows: int) -> torch.Tensor:
    """A block scale grid repeated to one scale per element of a ``rows × cols`` tensor."""
    block_cols = cols // scale.shape[1]
    return scale.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``q * scale`` for any granularity's scale (0-dim, (rows, 1) or a block grid: one
    scale row per row of ``q``, or per BLOCK rows)."""
    qf = q.float()
    if scale.dim() == 2 and qf.dim() == 2 and scale.shape[1] != 1 and scale.shape != qf.shape:
        block_rows = 1 if scale.shape[0] == qf.shape[0] else BLOCK
        return qf * expand_scale(scale, *qf.shape, block_rows)
    return qf * scale


def fake_quantize(x: torch.Tensor, granularity: Granularity, operand: Operand = Operand.ACTIVATION
                  ) -> torch.Tensor:
    """``dequantize(quantize(x))`` in x's dtype: the values an FP8 GEMM actually multiplies."""
    if block_shape(granularity, operand) is not None and x.dim() != 2:
        return fake_quantize(x.reshape(-1, x.shape[-1]), granularity, operand).reshape(x.shape)
    q, scale = quantize(x, granularity, operand)
    return dequantize(q, scale).to(x.dtype)
