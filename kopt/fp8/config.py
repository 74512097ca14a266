"""What :func:`kopt.compile(model, fp8=...)` quantizes, how finely, and the quality it must keep."""

from __future__ import annotations

import dataclasses
import enum
import fnmatch


class Granularity(enum.Enum):
    """How many scales a tensor gets (weights: fixed at compile time; activations: every call)."""

    TENSOR = "tensor"  # one scale per weight, one per activation tensor
    ROW = "row"  # one per weight output channel, one per activation row (token): Hopper's rowwise GEMM
    BLOCK_1X128 = "block-1x128"  # one per 1×128 slice of an activation row and of a weight row
    BLOCK_128X128 = "block-128x128"  # 1×128 activation slices, 128×128 weight tiles (DeepSeek-V3)



@dataclasses.dataclass(frozen=True)
class QualityGate:
    """The error a quantized model may add to eager bf16's, both measured against a higher-precision
    reference of the same weights (:func:`kopt.fp8.judge`, ``verify=True``).

    SQNR (dB) = 10·log10(‖ref‖² / ‖out − ref‖²) = −20·log10(relative error): the quantized output's
    relative error may exceed eager's by ``10**(-min_sqnr_db/20)`` and its angle to the reference
    eager's by ``acos(min_cosine)``. 0.999 cosine and 25 dB are what rowwise FP8 DiTs reach (a
    hand-written rowwise baseline on Qwen-Image and FLUX.2 keeps above 0.9998 against bf16); a model
    that misses them needs layers kept in bf16 (:func:`kopt.fp8.scan_sensitivity`).
    """

    min_cosine: float = 0.999
    min_sqnr_db: float = 25.0

    @property
    def max_rel_err(self) -> float:
        return 10 ** (-self.min_sqnr_db / 20)


@dataclasses.dataclass(frozen=True)
class Fp8Config:
    """FP8 (``float8_e4m3fn``) linears with weights quantized once at compile time.

    Attributes:
        granularity: scale granularity (``"row"``: per output channel / per token, the default).
        include: glob patterns on a linear's weight path (``transformer_blocks.*.attn.to_q.weight``);
            only matching linears are quantized. Under regional compilation a repeated block's
            weight matches by its path in the model or in the block (``attn.to_q.weight``), block by
            block (:mod:`kopt.fp8.per_block`).
        skip: glob patterns of weight paths kept in bf16 (checked after ``include``), e.g. the
            output projection, or the layers :func:`kopt.fp8.scan_sensitivity` found most sensitive.
        blocks: with ``regional=True``, the positions (in model order, from 0) of the repeated
            blocks whose linears may be quantized; the others stay bf16 (errors grow through the
            layers, and the first and last are often the most sensitive). None: every block. Linears
            outside the repeated blocks are selected by ``include`` and ``skip`` alone.
        min_features: linears with fewer input or output features stay bf16 (quantizing a small
            GEMM costs more than it saves).
        gate: the quality the quantized model must keep (checked by ``verify=True``).
        attention: also run attention in FP8 (``fp8-attention``: Q per row, K and V per key tile on
            FP8 tensor cores). Off by default: it adds the attention's FP8 rounding to the linears',
            and it does not pay everywhere (a forward that runs at the card's power cap may lose time).
        fast_accum: FP8 GEMMs (``_scaled_mm``, tensor and row scales) accumulate in the tensor
            cores' own precision instead of promoting partial sums to float32 every few steps
            (cuBLAS' fast accumulation, as torchao's inference recipe uses): faster on Hopper, at an
            accumulation error far below FP8's rounding of the inputs; the gate checks the result.
            Where the GPU's ``_scaled_mm`` refuses it, the GEMMs accumulate in float32 and the
            report says so.
    """

    granularity: Granularity | str = Granularity.ROW
    include: tuple[str, ...] = ("*",)
    skip: tuple[str, ...] = ()
    min_features: int = 1024
    gate: QualityGate = QualityGate()
    attention: bool = False
    fast_accum: bool = True
    blocks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        granularity = Granularity(self.granularity)  # an unknown name raises ValueError
        object.__setattr__(self, "granularity", granularity)
        object.__setattr__(self, "include", tuple(self.include))
        object.__setattr__(self, "skip", tuple(self.skip))
        if self.min_features < 0:
            raise ValueError(f"min_features must be >= 0, got {self.min_features}")
        if self.blocks is not None:
            blocks = tuple(sorted(set(self.blocks)))
            if any(type(b) is not int or b < 0 for b in blocks):
                raise ValueError(f"blocks must be non-negative block positions, got {self.blocks!r}")
            object.__setattr__(self, "blocks", blocks)

    def selects(self, weight_path: str | None) -> str | None:
        """None if the linear whose weight is at ``weight_path`` is quantized, else why not."""
        if weight_path is None:
            return "the weight is not a parameter of the model (no path to select it by)"
        if not any(fnmatch.fnmatchcase(weight_path, p) for p in self.include):
            return f"{weight_path} matches no include pattern {list(self.include)}"
        for pattern in self.skip:
            if fnmatch.fnmatchcase(weight_path, pattern):
                return f"{weight_path} is skipped by {pattern!r}"
        return None
