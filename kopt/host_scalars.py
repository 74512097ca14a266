"""Record a Python number sent to the GPU as a fill kernel, so that a CUDA graph can capture it.

``torch.as_tensor(n, device="cuda")`` and ``torch.tensor(n, device="cuda")`` build the tensor on the
host and copy it to the device; a pageable host-to-device copy cannot be captured, so one such call
anywhere in a forward stops the whole forward from being recorded (diffusers' Qwen-Image builds a
per-sample text length this way, ``torch.as_tensor(text_seq_len, device=...)``). While a recording
runs, :func:`host_scalars_as_fills` makes those two calls, for a plain ``bool``/``int``/``float`` and
a non-CPU device given by keyword, return ``torch.full((), n, dtype=..., device=...)`` instead.

Valid because both compute the same 0-d tensor: the dtype is the one ``torch.as_tensor`` infers
(``bool``, ``int64``, or the default float dtype) unless one is given, and the value is the Python
number itself. Baking it into the recording adds no hazard of its own: every other Python value the
recorded forward computed (a shape, a scale read from an attribute) is baked the same way, and a
recording is keyed by the call's shapes and plain arguments. Any other form (a list, a tensor, more
keywords, a positional dtype or device) goes to torch unchanged.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

_FORMS = frozenset({"dtype", "device"})


def _inferred_dtype(value: bool | int | float) -> torch.dtype:
    if isinstance(value, bool):
        return torch.bool
    if isinstance(value, int):
        return torch.int64
    return torch.get_default_dtype()


def as_fill(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``original`` (``torch.as_tensor`` or ``torch.tensor``) with a device-side fill for Python numbers."""

    @functools.wraps(original)
    def call(data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if (args or not set(kwargs) <= _FORMS or device is None or not isinstance(data, (bool, int, float))
                or torch.device(device).type == "cpu"):
            return original(data, *args, **kwargs)
        dtype = kwargs.get("dtype") or _inferred_dtype(data)
        return torch.full((), data, dtype=dtype, device=device)

    return call


@contextlib.contextmanager
def host_scalars_as_fills() -> Iterator[None]:
    """Within the block, ``torch.as_tensor`` / ``torch.tensor`` of a Python number on a device fill on it."""
    originals = torch.as_tensor, torch.tensor
    torch.as_tensor, torch.tensor = as_fill(originals[0]), as_fill(originals[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.as_tensor, torch.tensor = originals  # type: ignore[assignment]
