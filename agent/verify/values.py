"""Input values that expose wrong candidates: each profile targets one way to be silently wrong.

* ``normal``: N(0, 1), the everyday case.
* ``large`` / ``small``: magnitudes outside float16's range (2^16, 2^-20 for float32/bfloat16
  inputs): a candidate that computes in float16 where the contract is float32 overflows to inf or
  loses its mantissa to subnormals, and fails even a loose tolerance.
* ``offset``: a large mean with unit spread (2^10 + N(0, 1)): a variance computed as E[x^2] - E[x]^2,
  or any reduction in low precision, cancels catastrophically; a stable one does not.
* ``halfway``: exact midpoints between neighbouring bfloat16 or float16 values (for low-precision
  inputs, between float8 e4m3 values): every rounding is a tie, so truncating instead of rounding,
  or rounding where the original does not, shows at the first op.
* ``special``: +0, -0, subnormals, tiny and unit values mixed into normal ones.
* ``nonfinite``: NaN and +-inf mixed in: a candidate must propagate them where the original does,
  and must not map them to finite values (NaN masking).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch


class Profile(enum.Enum):
    NORMAL = "normal"
    LARGE = "large"
    SMALL = "small"
    OFFSET = "offset"
    HALFWAY = "halfway"
    SPECIAL = "special"
    NONFINITE = "nonfinite"


_LOW = (torch.float16, torch.bfloat16)


def _scale(dtype: torch.dtype, profile: Profile) -> float:
    if profile is Profile.LARGE:
        return 2.0 ** (6 if dtype is torch.float16 else 16)
    if profile is Profile.SMALL:
        return 2.0 ** (-6 if dtype is torch.float16 else -20)
    return 1.0


def _neighbour_midpoints(count: int, grid: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """``count`` exact midpoints between adjacent values of ``grid`` (float16, bfloat16 or float8)."""
    base = torch.randn(count, generator=generator, dtype=torch.float64).to(grid)
    bits = {1: torch.uint8, 2: torch.int16}[base.element_size()]
    upper = (base.view(bits) + 1).view(grid)  # the next value away from zero (same sign)
    return (base.double() + upper.double()) / 2


def _halfway(count: int, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    if dtype in _LOW:
        return _neighbour_midpoints(count, torch.float8_e4m3fn, generator)
    half = count // 2
    return torch.cat([_neighbour_midpoints(half, torch.bfloat16, generator),
                      _neighbour_midpoints(count - half, torch.float16, generator)])


def _special(values: torch.Tensor, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    tiny = 1e-7 if dtype is torch.float16 else 1e-40  # subnormal in the input's own format
    choices = torch.tensor([0.0, -0.0, tiny, -tiny, 2.0 ** -30, 1.0, -1.0], dtype=torch.float64)
    pick = torch.rand(values.shape, generator=generator) < 0.25
    index = torch.randint(len(choices), values.shape, generator=generator)
    return torch.where(pick, choices[index], values)


def _nonfinite(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    choices = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=torch.float64)
    pick = torch.rand(values.shape, generator=generator) < 0.02
    index = torch.randint(len(choices), values.shape, generator=generator)
    return torch.where(pick, choices[index], values)


def float_values(shape: Sequence[int], dtype: torch.dtype, profile: Profile,
                 generator: torch.Generator) -> torch.Tensor:
    """Values of ``profile`` for a float tensor, generated in float64, returned in ``dtype``."""
    count = 1
    for size in shape:
        count *= size
    if profile is Profile.HALFWAY:
        flat = _halfway(count, dtype, generator)
        flat = flat[torch.randperm(count, generator=generator)]
    else:
        flat = torch.randn(count, generator=generator, dtype=torch.float64) * _scale(dtype, profile)
        if profile is Profile.OFFSET:
            flat = flat + (16.0 if dtype in _LOW else 1024.0)
        elif profile is Profile.SPECIAL:
            flat = _special(flat, dtype, generator)
        elif profile is Profile.NONFINITE:
            flat = _nonfinite(flat, generator)
    return flat.reshape(tuple(shape)).to(dtype)


def values(shape: Sequence[int], dtype: torch.dtype, profile: Profile, generator: torch.Generator) -> torch.Tensor:
    """A contiguous tensor of ``shape`` and ``dtype`` for one trial input."""
    if dtype.is_floating_point:
        return float_values(shape, dtype, profile, generator)
    if dtype.is_complex:
        real = float_values((*shape, 2), torch.float64 if dtype is torch.complex128 else torch.float32, profile,
                            generator)
        return torch.view_as_complex(real.contiguous()).to(dtype)
    if dtype is torch.bool:
        return torch.rand(tuple(shape), generator=generator) < 0.5
    low = 0 if dtype is torch.uint8 else -8
    return torch.randint(low, 8, tuple(shape), generator=generator, dtype=dtype)
