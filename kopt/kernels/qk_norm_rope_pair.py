"""QK RMSNorm + rotary embedding of Q and K in one kernel that reads the RoPE tables once.

Q and K of one attention are rotated by the same ``cos``/``sin`` tables; run as two
:mod:`qk_norm_rope` kernels, each reads the tables. Where the tables are large next to a row of Q
(LTX-Video normalizes across heads: one 2048-wide row per token, with (S, 2048) float32 tables,
16 KB of table per 4 KB bf16 row), that second read is a third of both kernels' bytes. Here one
program loads a tile's table rows once and normalizes and rotates the Q tile and the K tile with
them (``PAIR`` in :func:`kopt.kernels.qk_norm_rope._qk_norm_rope_kernel`).

Per tensor the computation is exactly :func:`kopt.kernels.qk_norm_rope.reference` with its own
weight and eps; the pair only shares the table loads.

Bytes moved (memory floor): ``2 * 2 * N * e`` (read and write Q and K) plus the tables once,
against twice the tables for two kernels.
"""

import torch

from kopt.kernels import qk_norm_rope as _single

__all__ = ["qk_norm_rope_pair", "reference"]


def reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float, x2: torch.Tensor,
              weight2: torch.Tensor | None, eps2: float, cos: torch.Tensor, sin: torch.Tensor,
              mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager spec: each tensor's :func:`kopt.kernels.qk_norm_rope.reference`."""
    return (_single.reference(x, weight, cos, sin, eps, mode), _single.reference(x2, weight2, cos, sin, eps2, mode))


@torch.library.custom_op("kopt::qk_norm_rope_pair", mutates_args=())
def qk_norm_rope_pair(x: torch.Tensor, weight: torch.Tensor | None, eps: float, x2: torch.Tensor,
                      weight2: torch.Tensor | None, eps2: float, cos: torch.Tensor, sin: torch.Tensor,
                      mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(qk_norm_rope(x, weight, eps), qk_norm_rope(x2, weight2, eps2)) with shared tables: one
    Triton kernel on CUDA, :func:`reference` elsewhere."""
    if x.is_cuda:
        return _single.launch_pair(x, weight, eps, x2, weight2, eps2, cos, sin, mode)
    return reference(x, weight, eps, x2, weight2, eps2, cos, sin, mode)


@qk_norm_rope_pair.register_fake
def _(x, weight, eps, x2, weight2, eps2, cos, sin, mode):
    if x.shape != x2.shape or x.dtype != x2.dtype:
        raise ValueError(f"qk_norm_rope_pair: x {tuple(x.shape)} {x.dtype} and x2 {tuple(x2.shape)} {x2.dtype} "
                         "must agree on shape and dtype")
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x2.shape, dtype=x2.dtype, device=x2.device))
