"""Activation + row-wise FP8 quantization in one kernel, optionally behind a prefix: the input of an
FP8 down projection.

    y   = cat([prefix, act(h)], dim=-1)                       (M, P + F), rounded to h.dtype
    q   = clamp(y / scale, ±448).to(float8_e4m3fn),  scale = max(amax(|y|, -1), 1e-12) / 448

with ``act`` one of

* ``"swiglu"``: ``silu(h[:, :F]) * h[:, F:]`` (h is (M, 2F)): FLUX.2's feed-forwards, and its
  single-stream blocks, which feed ``cat([attention output, SwiGLU(mlp)])`` to one projection;
* ``"gelu_tanh"``: ``gelu(h, approximate="tanh")`` (h is (M, F)): Qwen-Image's feed-forwards.

Unfused (Inductor on the quantized graph) this is one kernel computing the row amax and a second
one recomputing y and writing q, so the bf16 input (340 MB per FLUX.2 single-stream block, 100 MB
per Qwen-Image feed-forward) is read twice from DRAM. Here one program owns one row and makes both
passes over it back to back, so the second read of the row can come from L2 — if few enough rows are
in flight for their inputs to stay there (73 KB per FLUX.2 row). How many are in flight is set by
the launch config (BLOCK columns per step, num_warps), which is autotuned per shape. When the
prefix and the activation each fit one BLOCK (Qwen-Image: F = 12288 with BLOCK = 16384; FLUX.2:
F = 18432 and P = 6144 with BLOCK = 32768 over 32 warps, the prefix in its own power-of-two block),
the values stay in registers between the amax and the store: one read of the row. The kernel is
bound by instruction issue more than by memory (one exp2 and one reciprocal per value; 28.7 SASS
instructions per value at Qwen-Image's width in one block, ``python benchmarks/tools/sass.py``), so two
more layouts are candidates: a row held as 2..5 register chunks (``IN_REGISTERS``: 12288 =
3 x 4096 wastes no lanes, where one 16384-wide block computes a quarter of its lanes for nothing;
20.3 instructions per value) and a fixed grid of programs that each prefetch their next row
(``PREFETCH``: it wins on few rows, such as FLUX.2's 512 text rows).

Numerics equal the unfused graph's: each activation step is rounded to h.dtype as the bf16 graph
rounds it (silu, then the product; gelu), then quantized exactly like
:func:`kopt.fp8.quantize.quantize` (ROW).

Bytes moved (memory floor): read ``M * (P + W) * e`` (W = 2F for SwiGLU, F for GELU), write
``M * (P + F)`` (fp8) + ``4 * M``. FLUX.2 single-stream block, M = 4608, P = 6144, F = 18432, bf16:
396 MB + 113 MB ≈ 0.12 ms at 4.2 TB/s; Qwen-Image feed-forward, M = 4096, F = 12288: 100 + 50 MB.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from kopt.fp8.config import Granularity
from kopt.fp8.quantize import FP8, quantize
from kopt.kernels import _autotune
from kopt.kernels._autotune import Config, pow2_bucket, shape_key
from kopt.kernels._fastmath import exp2, fast_math, reciprocal, round_to
from kopt.kernels._pdl import begin, launch_options
from kopt.kernels._rows import fp8_scale, fp8_values

__all__ = ["ACTIVATIONS", "activation_quant", "candidates", "launch", "offered", "reference"]
ACTIVATIONS = ("swiglu", "gelu_tanh")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def activate(h: torch.Tensor, act: str) -> torch.Tensor:
    """The activation as the model's graph computes it, in h.dtype."""
    if act == "swiglu":
        f = h.shape[-1] // 2
        return torch.nn.functional.silu(h[..., :f]) * h[..., f:]
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(h, approximate="tanh")
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {act!r}")


def reference(h: torch.Tensor, prefix: torch.Tensor | None = None, act: str = "swiglu"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager spec: the unfused graph's activation (in h.dtype), cat, then row-wise FP8 quantization."""
    y = activate(h, act)
    if prefix is not None:
        y = torch.cat([prefix, y], dim=-1)
    return quantize(y.reshape(-1, y.shape[-1]), Granularity.ROW)


_GELU_A = tl.constexpr(-1.5957691216057308 * 1.4426950408889634)  # -2·sqrt(2/π)·log2(e)
_GELU_B = tl.constexpr(-1.5957691216057308 * 1.4426950408889634 * 0.044715)


@triton.jit
def _activate(x, u, dtype, IS_SWIGLU: tl.constexpr, FAST: tl.constexpr):
    """act of loaded values (x; u the SwiGLU up half), each step rounded to ``dtype`` as the graph
    rounds it. Both activations are x / (1 + 2^(x·k(x))): GELU-tanh's 0.5·x·(1 + tanh z) is
    x·sigmoid(2z), z = sqrt(2/π)(x + 0.044715x³); SiLU is x·sigmoid(x). One exp2 and one
    reciprocal per value (:mod:`kopt.kernels._fastmath`): this kernel is bound by instruction issue."""
    x = x.to(tl.float32)
    if IS_SWIGLU:
        # (Triton packs these roundings two per instruction itself: round_to's would add shuffles)
        s = (x * reciprocal(1.0 + exp2(x * -1.4426950408889634, FAST), FAST)).to(dtype).to(tl.float32)
        y = (s * u.to(tl.float32)).to(dtype).to(tl.float32)
    else:
        y = round_to(x * reciprocal(1.0 + exp2(x * (_GELU_A + _GELU_B * (x * x)), FAST), FAST), dtype, FAST)
    return y


@triton.jit
def _activation(h_ptr, row_start, offs, mask, F, IS_SWIGLU: tl.constexpr, FAST: tl.constexpr):
    """act(h) at ``offs`` of one row, each step rounded to h's dtype as the unfused graph rounds it."""
    x = tl.load(h_ptr + row_start + offs, mask=mask, other=0.0)
    u = x
    if IS_SWIGLU:
        u = tl.load(h_ptr + row_start + F + offs, mask=mask, other=0.0)
    return _activate(x, u, h_ptr.dtype.element_ty, IS_SWIGLU, FAST)


@triton.jit
def _prefix_and_scale(prefix_ptr, scale_ptr, row, stride_p, P, row_max, HAS_PREFIX: tl.constexpr,
                      PREFIX_BLOCK: tl.constexpr):
    """(the prefix row in float32, its columns, the row's scale) for a row whose activation's amax is
    ``row_max``, the prefix read whole; the scale is stored. Without a prefix, placeholders for it."""
    prefix_cols = tl.arange(0, PREFIX_BLOCK)
    x = tl.zeros([PREFIX_BLOCK], dtype=tl.float32)
    if HAS_PREFIX:
        x = tl.load(prefix_ptr + row * stride_p + prefix_cols, mask=prefix_cols < P, other=0.0).to(tl.float32)
        row_max = tl.maximum(row_max, tl.max(tl.abs(x), axis=0))
    scale = fp8_scale(row_max)
    tl.store(scale_ptr + row, scale)
    return x, prefix_cols, scale


@triton.jit
def _prefix_amax(prefix_ptr, row_start, cols, P, amax, BLOCK: tl.constexpr, P_CHUNKS: tl.constexpr):
    """``amax`` (per lane) folded with |prefix| of one row, read in BLOCK-wide pieces."""
    for chunk in range(0, P_CHUNKS):
        offs = chunk * BLOCK + cols
        x = tl.load(prefix_ptr + row_start + offs, mask=offs < P, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    return amax


@triton.jit
def _store_prefix(prefix_ptr, row_start, q_row_ptr, cols, P, scale, BLOCK: tl.constexpr, P_CHUNKS: tl.constexpr):
    """The prefix of one row read again in BLOCK-wide pieces (from L2: the amax pass just read it) and
    stored as FP8 with the row's scale."""
    for chunk in range(0, P_CHUNKS):
        offs = chunk * BLOCK + cols
        x = tl.load(prefix_ptr + row_start + offs, mask=offs < P, other=0.0).to(tl.float32)
        tl.store(q_row_ptr + offs, fp8_values(x, scale).to(q_row_ptr.dtype.element_ty), mask=offs < P)


@triton.jit
def _activation_quant_kernel(prefix_ptr, h_ptr, q_ptr, scale_ptr, P, F, stride_p, stride_h, stride_q,
                             HAS_PREFIX: tl.constexpr, IS_SWIGLU: tl.constexpr, BLOCK: tl.constexpr,
                             P_CHUNKS: tl.constexpr, F_CHUNKS: tl.constexpr, ONE_PASS: tl.constexpr,
                             PREFIX_BLOCK: tl.constexpr, FAST: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    # The trip counts are constexpr (one compile per width): Triton's CPU interpreter cannot loop to a
    # runtime bound, and a model has only a few distinct widths.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:  # the activation fits one BLOCK (the prefix one PREFIX_BLOCK): one read, values kept in registers
        y = _activation(h_ptr, row * stride_h, cols, cols < F, F, IS_SWIGLU, FAST)
        x, prefix_cols, scale = _prefix_and_scale(prefix_ptr, scale_ptr, row, stride_p, P, tl.max(tl.abs(y), axis=0),
                                                  HAS_PREFIX, PREFIX_BLOCK)
        if HAS_PREFIX:
            q = fp8_values(x, scale)
            tl.store(q_ptr + row * stride_q + prefix_cols, q.to(q_ptr.dtype.element_ty), mask=prefix_cols < P)
        q = fp8_values(y, scale)
        tl.store(q_ptr + row * stride_q + P + cols, q.to(q_ptr.dtype.element_ty), mask=cols < F)
    else:  # two passes over the row, BLOCK columns at a time
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        # pass 1: the row's amax
        if HAS_PREFIX:
            amax = _prefix_amax(prefix_ptr, row * stride_p, cols, P, amax, BLOCK, P_CHUNKS)
        for chunk in range(0, F_CHUNKS):
            offs = chunk * BLOCK + cols
            y = _activation(h_ptr, row * stride_h, offs, offs < F, F, IS_SWIGLU, FAST)
            amax = tl.maximum(amax, tl.abs(y))
        scale = fp8_scale(tl.max(amax, axis=0))
        tl.store(scale_ptr + row, scale)
        # pass 2: the same values again (this row is still in L2), quantized
        if HAS_PREFIX:
            _store_prefix(prefix_ptr, row * stride_p, q_ptr + row * stride_q, cols, P, scale, BLOCK, P_CHUNKS)
        for chunk in range(0, F_CHUNKS):
            offs = chunk * BLOCK + cols
            y = _activation(h_ptr, row * stride_h, offs, offs < F, F, IS_SWIGLU, FAST)
            q = fp8_values(y, scale)
            tl.store(q_ptr + row * stride_q + P + offs, q.to(q_ptr.dtype.element_ty), mask=offs < F)


@triton.jit
def _load_row(prefix_ptr, h_ptr, row, M, P, F, stride_p, stride_h, cols, prefix_cols,
              HAS_PREFIX: tl.constexpr, IS_SWIGLU: tl.constexpr):
    """One row's raw inputs (x, the SwiGLU up half u, the prefix); zeros past the last row. (The row
    test is made per column: Triton 3.9's interpreter rejects a mask that ANDs a vector with a scalar.)"""
    x = tl.load(h_ptr + row * stride_h + cols, mask=(cols < F) & (cols * 0 + row < M), other=0.0)
    u = x
    if IS_SWIGLU:
        u = tl.load(h_ptr + row * stride_h + F + cols, mask=(cols < F) & (cols * 0 + row < M), other=0.0)
    pre = x
    if HAS_PREFIX:
        pre = tl.load(prefix_ptr + row * stride_p + prefix_cols, mask=(prefix_cols < P) & (prefix_cols * 0 + row < M),
                      other=0.0)
    return x, u, pre


@triton.jit
def _activation_quant_prefetch_kernel(prefix_ptr, h_ptr, q_ptr, scale_ptr, M, P, F, stride_p, stride_h, stride_q,
                                      HAS_PREFIX: tl.constexpr, IS_SWIGLU: tl.constexpr, BLOCK: tl.constexpr,
                                      PREFIX_BLOCK: tl.constexpr, ITERS: tl.constexpr,
                                      FAST: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    # The one-pass body of _activation_quant_kernel, for rows pid, pid + G, ... (G programs, a few per
    # SM): the next row's loads are issued before the current row's amax, activation and stores, so
    # that a program always has a row in flight. A program of the plain kernel idles the memory
    # system while it reduces and stores its only row.
    grid = tl.num_programs(0)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    prefix_cols = tl.arange(0, PREFIX_BLOCK)
    dtype = h_ptr.dtype.element_ty
    x_next, u_next, pre_next = _load_row(prefix_ptr, h_ptr, row, M, P, F, stride_p, stride_h, cols, prefix_cols,
                                         HAS_PREFIX, IS_SWIGLU)
    for _ in range(0, ITERS):
        x, u, pre = x_next, u_next, pre_next
        x_next, u_next, pre_next = _load_row(prefix_ptr, h_ptr, row + grid, M, P, F, stride_p, stride_h, cols,
                                             prefix_cols, HAS_PREFIX, IS_SWIGLU)
        live = row < M
        y = _activate(x, u, dtype, IS_SWIGLU, FAST)
        row_max = tl.max(tl.abs(y), axis=0)
        if HAS_PREFIX:
            pre = pre.to(tl.float32)
            row_max = tl.maximum(row_max, tl.max(tl.abs(pre), axis=0))
        scale = fp8_scale(row_max)
        tl.store(scale_ptr + row, scale, mask=live)
        if HAS_PREFIX:
            tl.store(q_ptr + row * stride_q + prefix_cols, fp8_values(pre, scale).to(q_ptr.dtype.element_ty),
                     mask=(prefix_cols < P) & (prefix_cols * 0 + row < M))
        tl.store(q_ptr + row * stride_q + P + cols, fp8_values(y, scale).to(q_ptr.dtype.element_ty),
                 mask=(cols < F) & (cols * 0 + row < M))
        row += grid


@triton.jit
def _store_chunk(q_ptr, y, scale, offs, F):
    tl.store(q_ptr + offs, fp8_values(y, scale).to(q_ptr.dtype.element_ty), mask=offs < F)


@triton.jit
def _activation_quant_chunks_kernel(prefix_ptr, h_ptr, q_ptr, scale_ptr, P, F, stride_p, stride_h, stride_q,
                                    HAS_PREFIX: tl.constexpr, IS_SWIGLU: tl.constexpr, BLOCK: tl.constexpr,
                                    PREFIX_BLOCK: tl.constexpr, CHUNKS: tl.constexpr, P_CHUNKS: tl.constexpr,
                                    FAST: tl.constexpr, PDL: tl.constexpr):
    begin(PDL)
    # One read of the activation's row, held in registers as CHUNKS (2..5) blocks of BLOCK columns
    # rather than one power-of-two block: Qwen-Image's 12288 columns are 3 x 4096, where one
    # 16384-wide block computes a quarter of its lanes for nothing (this kernel is bound by
    # instruction issue, not memory). The prefix is only copied, not computed: it is read twice, in
    # BLOCK-wide pieces (its amax, then its values, the second time from L2), rather than held, so
    # that the registers go to the activation and two programs fit an SM (FLUX.2's single-stream row
    # at 16 warps: 62 registers a thread, ``python benchmarks/tools/sass.py``).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    base = row * stride_h
    y0 = _activation(h_ptr, base, cols, cols < F, F, IS_SWIGLU, FAST)
    y1 = _activation(h_ptr, base, BLOCK + cols, BLOCK + cols < F, F, IS_SWIGLU, FAST)
    largest = tl.maximum(tl.abs(y0), tl.abs(y1))  # element-wise across chunks: one reduction at the end
    if CHUNKS > 2:
        y2 = _activation(h_ptr, base, 2 * BLOCK + cols, 2 * BLOCK + cols < F, F, IS_SWIGLU, FAST)
        largest = tl.maximum(largest, tl.abs(y2))
    if CHUNKS > 3:
        y3 = _activation(h_ptr, base, 3 * BLOCK + cols, 3 * BLOCK + cols < F, F, IS_SWIGLU, FAST)
        largest = tl.maximum(largest, tl.abs(y3))
    if CHUNKS > 4:
        y4 = _activation(h_ptr, base, 4 * BLOCK + cols, 4 * BLOCK + cols < F, F, IS_SWIGLU, FAST)
        largest = tl.maximum(largest, tl.abs(y4))
    if HAS_PREFIX:
        largest = _prefix_amax(prefix_ptr, row * stride_p, cols, P, largest, BLOCK, P_CHUNKS)
    scale = fp8_scale(tl.max(largest, axis=0))
    tl.store(scale_ptr + row, scale)
    if HAS_PREFIX:
        _store_prefix(prefix_ptr, row * stride_p, q_ptr + row * stride_q, cols, P, scale, BLOCK, P_CHUNKS)
    out = q_ptr + row * stride_q + P
    _store_chunk(out, y0, scale, cols, F)
    _store_chunk(out, y1, scale, BLOCK + cols, F)
    if CHUNKS > 2:
        _store_chunk(out, y2, scale, 2 * BLOCK + cols, F)
    if CHUNKS > 3:
        _store_chunk(out, y3, scale, 3 * BLOCK + cols, F)
    if CHUNKS > 4:
        _store_chunk(out, y4, scale, 4 * BLOCK + cols, F)


DEFAULT_CONFIG: Config = {"BLOCK": 1024, "num_warps": 4}
_BLOCKS = (1024, 2048, 4096, 8192, 16384, 32768)  # the large ones keep a whole row in registers (one read)
_WARPS = (4, 8, 16, 32)


_PREFETCH = (1, 2)  # programs per SM of the prefetching kernel
_CHUNK_BLOCKS = (2048, 4096, 8192)  # register chunks of the IN_REGISTERS kernel (2..5 per row)
_MAX_CHUNKS = 5


@functools.cache
def _candidates(width: int) -> tuple[Config, ...]:
    plain = _autotune.block_candidates(DEFAULT_CONFIG, max(width, 1024), _BLOCKS, _WARPS, 4)
    block = max(width, 1024)  # the whole row (width is a power-of-two bucket): the one-pass body
    prefetching = tuple({"BLOCK": block, "num_warps": warps, "PREFETCH": per_sm} for warps in _WARPS
                        for per_sm in _PREFETCH if 8 <= block // (32 * warps) <= 32)
    in_registers = tuple({"BLOCK": block, "num_warps": warps, "IN_REGISTERS": 1} for block in _CHUNK_BLOCKS
                         for warps in _WARPS if 2 * block <= width and 4 <= block // (32 * warps) <= 8)
    return plain + prefetching + in_registers


def offered(f: int, p: int = 0) -> list[Config]:
    """The candidates the launcher tunes for an activation of ``f`` columns behind a ``p``-column
    prefix: ``candidates(p + f)`` less the ``IN_REGISTERS`` configs that would not split the
    activation into 2..5 chunks."""
    return [c for c in candidates(p + f) if not c.get("IN_REGISTERS") or 2 <= _chunks(c, f) <= _MAX_CHUNKS]


def _chunks(cfg: Config, f: int) -> int:
    """How many BLOCK-wide register chunks an ``IN_REGISTERS`` config splits an activation row of ``f`` into."""
    return math.ceil(f / cfg["BLOCK"])


def candidates(width: int) -> list[Config]:
    """Launch configs for rows of ``width`` outputs (a power-of-two bucket): the old fixed config
    first, then every (BLOCK, num_warps) with 4..32 elements per thread and BLOCK <= max(width, 1024).
    Bigger programs keep fewer rows in flight (the second pass reads them from L2), and a BLOCK
    holding the whole activation and prefix makes the kernel read the row once. Configs with
    ``PREFETCH`` (programs per SM) run the one-pass body in a fixed grid of programs that each load
    their next row before working on the current one; ``IN_REGISTERS`` configs read the row once and
    hold it as 2..5 BLOCK-wide chunks (the launcher offers only those that split the row so)."""
    return [dict(c) for c in _candidates(pow2_bucket(width))]


def _programs(device: torch.device, per_sm: int) -> int:
    """The prefetching kernel's grid: ``per_sm`` programs per SM (4 SMs' worth when interpreted)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return sms * per_sm


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(M, width) view with unit last-dim stride (a copy only if the last dim is strided)."""
    t = t.reshape(-1, t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def launch(h: torch.Tensor, prefix: torch.Tensor | None = None, act: str = "swiglu", *,
           config: Config | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel: (q (M, P + F) float8_e4m3fn, scale (M, 1) float32), M = rows of h.
    ``config`` forces a launch config (one of ``candidates``); by default the autotuner picks it."""
    if act not in ACTIVATIONS:
        raise ValueError(f"activation_quant: activation must be one of {ACTIVATIONS}, got {act!r}")
    if h.dtype not in _DTYPES or (act == "swiglu" and h.shape[-1] % 2):
        raise ValueError(f"activation_quant: h must be a float tensor (with an even last dim for swiglu), got "
                         f"{h.dtype} {tuple(h.shape)}")
    h2 = _rows(h)
    m = h2.shape[0]
    f = h2.shape[1] // 2 if act == "swiglu" else h2.shape[1]
    p = 0
    if prefix is not None:
        if prefix.dtype != h.dtype or prefix.shape[:-1] != h.shape[:-1] or prefix.device != h.device:
            raise ValueError(f"activation_quant: prefix {prefix.dtype} {tuple(prefix.shape)} must match h "
                             f"{h.dtype} {tuple(h.shape)} in dtype, device and all but the last dim")
        prefix = _rows(prefix)
        p = prefix.shape[1]
    q = torch.empty((m, p + f), dtype=FP8, device=h.device)
    scale = torch.empty((m, 1), dtype=torch.float32, device=h.device)
    if not m:
        return q, scale

    def run(cfg: Config, q_out: torch.Tensor, scale_out: torch.Tensor) -> None:
        block = cfg["BLOCK"]
        args = (prefix if prefix is not None else h2, h2, q_out, scale_out)
        strides = (prefix.stride(0) if prefix is not None else 0, h2.stride(0), q_out.stride(0))
        flags = {"HAS_PREFIX": prefix is not None, "IS_SWIGLU": act == "swiglu", "BLOCK": block,
                 "PREFIX_BLOCK": triton.next_power_of_2(max(p, 1)), "FAST": fast_math(h.device),
                 "num_warps": cfg["num_warps"], **launch_options(h.device)}
        if cfg.get("IN_REGISTERS"):
            chunks = _chunks(cfg, f)
            if not 2 <= chunks <= _MAX_CHUNKS:
                raise ValueError(f"activation_quant: {cfg} splits {f} columns into {chunks} chunks, "
                                 f"not 2..{_MAX_CHUNKS}")
            _activation_quant_chunks_kernel[(m,)](*args, p, f, *strides, CHUNKS=chunks, P_CHUNKS=math.ceil(p / block),
                                                  **flags)
            return
        if cfg.get("PREFETCH"):
            if f > block or p > block:
                raise ValueError(f"activation_quant: a PREFETCH config needs the row in one BLOCK, got {cfg}")
            grid = min(m, _programs(h.device, cfg["PREFETCH"]))
            _activation_quant_prefetch_kernel[(grid,)](*args, m, p, f, *strides, ITERS=math.ceil(m / grid), **flags)
            return
        _activation_quant_kernel[(m,)](*args, p, f, *strides, P_CHUNKS=math.ceil(p / block),
                                       F_CHUNKS=math.ceil(f / block), ONE_PASS=f <= block and p <= block, **flags)

    key = shape_key(rows=pow2_bucket(m), prefix=p, width=f, act=act, dtype=h.dtype)
    _autotune.launch_tuned("activation_quant", key, offered(f, p), run, (q, scale), h.device, config)
    return q, scale


@torch.library.custom_op("kopt::activation_quant", mutates_args=())
def activation_quant(h: torch.Tensor, prefix: torch.Tensor | None = None, act: str = "swiglu"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise FP8 ``cat([prefix, act(h)])`` and its scales; Triton on CUDA, the reference elsewhere."""
    if h.is_cuda:
        return launch(h, prefix, act)
    q, scale = reference(h, prefix, act)
    return q.contiguous(), scale.contiguous()


@activation_quant.register_fake
def _(h, prefix=None, act="swiglu"):
    if act not in ACTIVATIONS:
        raise ValueError(f"activation_quant: activation must be one of {ACTIVATIONS}, got {act!r}")
    m = h.numel() // h.shape[-1]
    width = (h.shape[-1] // 2 if act == "swiglu" else h.shape[-1]) + (prefix.shape[-1] if prefix is not None else 0)
    return h.new_empty((m, width), dtype=FP8), h.new_empty((m, 1), dtype=torch.float32)
