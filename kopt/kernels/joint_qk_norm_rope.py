"""Joint attention input: QK RMSNorm + RoPE of several token streams written into one buffer.

Joint-attention DiTs (Qwen-Image's dual-stream blocks, FLUX.2's double-stream blocks) normalize
and rotate the text and the image Q (and K) separately, then concatenate them along the sequence
for one attention call. Unfused that is a norm/rope pass per stream plus a copy of everything into
the concatenated buffer. Here each stream's :mod:`qk_norm_rope` kernel writes its rows straight
into its slice of the joint (B, S_1 + ... + S_k, H, D) buffer, so the concatenation costs nothing.

Per segment i (x_i (B, S_i, H, D), its norm weight, eps and RoPE tables for its S_i tokens)::

    out[:, off_i : off_i + S_i] = qk_norm_rope.reference(x_i, weight_i, cos_i, sin_i, eps_i, mode)

Bytes moved (memory floor): the sum of the segments' qk_norm_rope bytes, ``2 * N * e`` for
N = B * S_total * H * D elements (read every x_i once, write the buffer once) plus the tables;
the unfused path moves another ``2 * N * e`` for the concatenation.

Launch: the buffer slice of one batch row, ``out[b, off_i : off_i + S_i]``, is contiguous, which
is what the qk_norm_rope launcher writes; for B == 1 (the production case) that is one launch per
segment, for B > 1 one per segment and batch row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kopt.kernels import qk_norm_rope as _single

__all__ = ["launch", "qk_norm_rope_joint", "reference"]


def _check_segments(xs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor | None], cos: Sequence[torch.Tensor],
                    sin: Sequence[torch.Tensor], eps: Sequence[float]) -> tuple[int, int, int, int]:
    """(B, S_total, H, D) after checking that the segments agree on everything but S."""
    if not xs:
        raise ValueError("qk_norm_rope_joint: needs at least one segment")
    counts = {len(xs), len(weights), len(cos), len(sin), len(eps)}
    if len(counts) != 1:
        raise ValueError(f"qk_norm_rope_joint: xs, weights, cos, sin and eps must have one entry per segment, got "
                         f"{len(xs)}, {len(weights)}, {len(cos)}, {len(sin)}, {len(eps)}")
    first = xs[0]
    if first.dim() != 4:
        raise ValueError(f"qk_norm_rope_joint: segments must be (B, S, H, D), got shape {tuple(first.shape)}")
    b, _, h, d = first.shape
    for i, x in enumerate(xs):
        if x.dim() != 4 or (x.shape[0], x.shape[2], x.shape[3]) != (b, h, d):
            raise ValueError(f"qk_norm_rope_joint: segment {i} has shape {tuple(x.shape)}, segment 0 "
                             f"{tuple(first.shape)}: B, H and D must agree")
        if x.dtype != first.dtype or x.device != first.device:
            raise ValueError(f"qk_norm_rope_joint: segment {i} is {x.dtype} on {x.device}, segment 0 "
                             f"{first.dtype} on {first.device}")
    return b, sum(x.shape[1] for x in xs), h, d


def reference(xs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor | None], cos: Sequence[torch.Tensor],
              sin: Sequence[torch.Tensor], eps: Sequence[float], mode: str) -> torch.Tensor:
    """Eager spec: each segment's qk_norm_rope reference, concatenated along the sequence."""
    _check_segments(xs, weights, cos, sin, eps)
    parts = [_single.reference(x, w, c, s, e, mode) for x, w, c, s, e in zip(xs, weights, cos, sin, eps, strict=True)]
    return torch.cat(parts, dim=1)


def launch(xs: Sequence[torch.Tensor], weights: Sequence[torch.Tensor | None], cos: Sequence[torch.Tensor],
           sin: Sequence[torch.Tensor], eps: Sequence[float], mode: str,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Run the qk_norm_rope kernel once per segment (and batch row when B > 1) into one buffer."""
    b, s_total, h, d = _check_segments(xs, weights, cos, sin, eps)
    dtype, device = xs[0].dtype, xs[0].device
    if out is None:
        out = torch.empty((b, s_total, h, d), dtype=dtype, device=device)
    elif tuple(out.shape) != (b, s_total, h, d) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"qk_norm_rope_joint: out must be a contiguous {dtype} tensor of shape "
                         f"{(b, s_total, h, d)}, got {out.dtype} {tuple(out.shape)} strides {out.stride()}")
    offset = 0
    for x, w, c, s, e in zip(xs, weights, cos, sin, eps, strict=True):
        length = x.shape[1]
        if b == 1:
            _single.launch(x, w, c, s, e, mode, out=out[:, offset:offset + length])
        else:
            for row in range(b):
                _single.launch(x[row:row + 1], w, c, s, e, mode, out=out[row:row + 1, offset:offset + length])
        offset += length
    return out


@torch.library.custom_op("kopt::qk_norm_rope_joint", mutates_args=())
def qk_norm_rope_joint(
    xs: list[torch.Tensor],
    weights: list[torch.Tensor | None],
    cos: list[torch.Tensor],
    sin: list[torch.Tensor],
    eps: list[float],
    mode: str,
) -> torch.Tensor:
    """cat([qk_norm_rope(x_i, ...) for each segment], dim=1) written in place; Triton on CUDA."""
    if xs and xs[0].is_cuda:
        return launch(xs, weights, cos, sin, eps, mode)
    return reference(xs, weights, cos, sin, eps, mode)


@qk_norm_rope_joint.register_fake
def _(xs, weights, cos, sin, eps, mode):
    b, s_total, h, d = _check_segments(xs, weights, cos, sin, eps)
    return xs[0].new_empty((b, s_total, h, d))
