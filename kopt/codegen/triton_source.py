"""Readable Triton source for a :class:`~kopt.codegen.region.Region` (pure text; nothing runs here).

The emitted module reads like a hand-written kernel file: a header, ``reference()`` (the region in
eager torch, float32 arithmetic, one rounding per output: the spec), the ``@triton.jit`` kernel,
``empty_outputs()`` and ``launch()``. Each program owns ``BLOCK_R`` rows of the full shape and the
whole row (``BLOCK_N`` = next power of two of N, masked), so a last-dim reduction is a register
reduction over axis 1 and every input is read once and every output written once. Inputs smaller
than the full shape are read through their broadcast strides (0 along broadcast dims), which is the
same indexing torch's broadcasting does. Every computing line ends with a comment naming the FX
node it came from. Only ``#`` comments carry node names and traced shapes; the code itself depends
only on what the region computes, so :mod:`kopt.codegen.cache` keys on the source without them
and identical regions (one per transformer block) share one kernel.
"""

from __future__ import annotations

import math

import torch

from kopt.codegen.ops import ELEMENTWISE, TORCH_DTYPE_NAMES, Operand, lit
from kopt.codegen.region import Ref, Region, Step

KERNEL_NAME = "region_kernel"


def _is_wide(shape: tuple[int, ...], n: int) -> bool:
    """Whether a value of ``shape`` varies along the last dim of a full shape ending in ``n``."""
    return n > 1 and len(shape) > 0 and shape[-1] == n


def _v(index: int) -> str:
    return f"v{index}"


def _operands(step: Step) -> list[Operand]:
    return [_v(a.index) if isinstance(a, Ref) else a for a in step.args]


def _origin(region: Region, step: Step) -> str:
    args = ", ".join(region.value_name(a.index) if isinstance(a, Ref) else lit(a) for a in step.args)
    extra = "".join(f", {k}={v}" for k, v in step.params)
    return f"# {step.node} = {step.target}({args}{extra})"


# ------------------------------------------------------------------------------------------- reference
def _torch_reduction(step: Step, operands: list[Operand]) -> str:
    x, keepdim = lit(operands[0]), step.param("keepdim")
    if step.op in ("sum", "mean", "amax", "amin"):
        return f"{x}.{step.op}(-1, keepdim={keepdim})"
    if step.op == "var":
        return f"{x}.var(-1, correction={step.param('correction')!r}, keepdim={keepdim})"
    if step.op == "var_mean":
        return f"torch.var_mean({x}, -1, correction={step.param('correction')!r}, keepdim={keepdim})"
    weight, bias = lit(operands[1]), lit(operands[2])
    return f"torch.native_layer_norm({x}, [{x}.shape[-1]], {weight}, {bias}, {step.param('eps')!r})"


def _reference(region: Region) -> list[str]:
    params = ", ".join(f"in{i}" for i in range(len(region.inputs)))
    lines = [f"def reference({params}):",
             '    """The region in eager torch: float32 arithmetic, one rounding per output (the spec)."""']
    for i, tensor in enumerate(region.inputs):
        widen = "" if tensor.dtype is torch.bool else ".float()"
        lines.append(f"    {_v(i)} = in{i}{widen}  # {tensor.node}")
    base = len(region.inputs)
    for j, step in enumerate(region.steps):
        operands = _operands(step)
        if step.op == "getitem":
            expr = f"{lit(operands[0])}[{step.param('index')}]"
        elif step.op in ELEMENTWISE:
            expr = ELEMENTWISE[step.op].torch(operands)
        else:
            expr = _torch_reduction(step, operands)
        lines.append(f"    {_v(base + j)} = {expr}  {_origin(region, step)}")
    results = ", ".join(f"{_v(o.value)}.to({TORCH_DTYPE_NAMES[o.dtype]}).contiguous()" for o in region.outputs)
    lines.append(f"    return ({results},)")
    return lines


# ---------------------------------------------------------------------------------------------- kernel
def _triton_reduction(step: Step, name: str, operands: list[Operand]) -> list[str]:
    """Lines computing a row reduction into ``name`` (tuple-valued ones into ``name_<part>``)."""
    x = lit(operands[0])
    if step.op in ("sum", "mean"):
        total = f"tl.sum(tl.where(mask, {x}, 0.0), axis=1)[:, None]"
        return [f"{name} = {total}" + (" / N" if step.op == "mean" else "")]
    if step.op in ("amax", "amin"):  # a row holding a NaN reduces to NaN, as torch.amax/amin do
        fill, fn = ('-float("inf")', "tl.max") if step.op == "amax" else ('float("inf")', "tl.min")
        return [f"{name}_nan = tl.max(tl.where(mask & ({x} != {x}), 1, 0), axis=1)[:, None] > 0",
                f"{name} = tl.where({name}_nan, float('nan'), {fn}(tl.where(mask, {x}, {fill}), axis=1)[:, None])"]
    lines = [f"{name}_mean = tl.sum(tl.where(mask, {x}, 0.0), axis=1)[:, None] / N",
             f"{name}_diff = tl.where(mask, {x} - {name}_mean, 0.0)"]
    if step.op in ("var", "var_mean"):
        suffix = "" if step.op == "var" else "_var"
        lines.append(f"{name}{suffix} = tl.sum({name}_diff * {name}_diff, axis=1)[:, None] / "
                     f"(N - {lit(step.param('correction'))})")
        return lines
    normed = f"{name}_diff * {name}_rstd"
    if operands[1] is not None:
        normed += f" * {lit(operands[1])}"
    if operands[2] is not None:
        normed += f" + {lit(operands[2])}"
    return lines + [f"{name}_var = tl.sum({name}_diff * {name}_diff, axis=1)[:, None] / N",
                    f"{name}_rstd = tl.rsqrt({name}_var + {lit(step.param('eps'))})",
                    f"{name}_out = {normed}"]


_PARTS = {"var_mean": ("var", "mean"), "layer_norm": ("out", "mean", "rstd")}


def _row_index_lines(rank: int) -> list[str]:
    """``i0, i1, ...``: the index of each row along the leading dims ``D0, D1, ...`` of the full shape."""
    dims = rank - 1
    if dims == 0:
        return []
    names = ", ".join(f"D{j}" for j in range(dims))
    lines = [f"    # each row's index along the leading dims ({names}) of the full shape"]
    for j in range(dims):
        inner = " * ".join(f"D{k}" for k in range(j + 1, dims))
        quotient = "rows" if not inner else f"rows // {inner}" if j + 2 == dims else f"rows // ({inner})"
        quotient = f"({quotient})" if j > 0 and inner else quotient
        lines.append(f"    i{j} = {quotient}" + (f" % D{j}" if j > 0 else ""))
    return lines


def _kernel(region: Region) -> list[str]:
    rank, n = len(region.full_shape), region.n
    dims = rank - 1
    pointers = [f"in{i}_ptr" for i in range(len(region.inputs))] + [f"out{k}_ptr" for k in range(len(region.outputs))]
    sizes = ", ".join(["ROWS", "N"] + [f"D{j}" for j in range(1, dims)])
    stride_lines = [f"    {', '.join(f'in{i}_s{d}' for d in range(rank))},  # in{i}'s strides, broadcast to full"
                    for i in range(len(region.inputs))]
    lines = ["@triton.jit",
             f"def {KERNEL_NAME}(",
             f"    {', '.join(pointers)},",
             f"    {sizes},  # rows of the full shape, its last dim, its leading dims after the first",
             *stride_lines,
             "    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,",
             "):",
             "    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]  # [BLOCK_R, 1]",
             "    cols = tl.arange(0, BLOCK_N)[None, :]  # [1, BLOCK_N]",
             "    row_mask = rows < ROWS",
             "    mask = row_mask & (cols < N)"]
    lines += _row_index_lines(rank)
    lines.append("    # loads: masked lanes read 1.0, which is never stored or reduced (keeps log/rsqrt finite)")
    for i, tensor in enumerate(region.inputs):
        offset = " + ".join([f"i{d} * in{i}_s{d}" for d in range(dims)] + (
            [f"cols * in{i}_s{dims}"] if _is_wide(tensor.shape, n) else [])) or "0"
        if tensor.dtype is torch.bool:
            load = f"tl.load(in{i}_ptr + {offset}, mask={'mask' if _is_wide(tensor.shape, n) else 'row_mask'}, other=0)"
        else:
            which = "mask" if _is_wide(tensor.shape, n) else "row_mask"
            load = f"tl.load(in{i}_ptr + {offset}, mask={which}, other=1.0).to(tl.float32)"
        lines.append(f"    {_v(i)} = {load}  # {tensor.node} {tensor.shape} {str(tensor.dtype).replace('torch.', '')}")
    base = len(region.inputs)
    for j, step in enumerate(region.steps):
        name, operands, origin = _v(base + j), _operands(step), _origin(region, step)
        if step.op == "getitem":
            source = region.steps[step.args[0].index - base]  # type: ignore[union-attr]
            part = _PARTS[source.op][step.param("index")]
            lines.append(f"    {name} = {lit(operands[0])}_{part}  {origin}")
        elif step.op in ELEMENTWISE:
            lines.append(f"    {name} = {ELEMENTWISE[step.op].triton(operands)}  {origin}")
        else:
            body = _triton_reduction(step, name, operands)
            lines += [f"    {line}" for line in body[:-1]] + [f"    {body[-1]}  {origin}"]
    lines.append("    # stores: one rounding per output, to its dtype")
    for k, output in enumerate(region.outputs):
        if output.kind == "full":
            target, which = f"out{k}_ptr + rows * N + cols", "mask"
        else:
            target, which = f"out{k}_ptr + rows", "row_mask"
        lines.append(f"    tl.store({target}, {_v(output.value)}.to(out{k}_ptr.dtype.element_ty), mask={which})"
                     f"  # {output.node} ({output.kind})")
    return lines


# -------------------------------------------------------------------------------------------- launcher
def _launcher(region: Region) -> list[str]:
    inputs = [f"in{i}" for i in range(len(region.inputs))]
    rank = len(region.full_shape)
    row_dims = "*full[1:-1], " if rank > 2 else ""
    strides = ", ".join(f"*in{i}.expand(full).stride()" for i in range(len(inputs)))
    outputs = ", ".join(f"out{k}" for k in range(len(region.outputs)))
    return [
        "def empty_outputs(full, device):",
        '    """Uninitialized contiguous outputs for a full shape (also the fake implementation)."""',
        "    shapes = {\"full\": tuple(full), \"row\": tuple(full[:-1]) + (1,), \"row_flat\": tuple(full[:-1])}",
        "    return tuple(torch.empty(shapes[kind], dtype=dtype, device=device) for kind, dtype in OUTPUTS)",
        "",
        "",
        f"def launch({', '.join(inputs)}):",
        '    """Run the kernel (on CUDA, or in the Triton interpreter); returns new contiguous outputs."""',
        f"    full = tuple(torch.broadcast_shapes({', '.join(f'{t}.shape' for t in inputs)}))",
        f"    wide = tuple(t.dim() > 0 and t.shape[-1] == full[-1] > 1 for t in ({', '.join(inputs)},))",
        "    if len(full) != RANK or wide != WIDE_INPUTS:",
        "        raise ValueError(f\"generated kernel traced for rank {RANK} and wide inputs {WIDE_INPUTS}, \"",
        "                         f\"got full shape {full} and wide inputs {wide}\")",
        f"    ({outputs},) = empty_outputs(full, {inputs[0]}.device)",
        "    n = full[-1]",
        "    rows = math.prod(full[:-1])",
        "    if rows * n == 0:",
        f"        return ({outputs},)",
        "    block_n = triton.next_power_of_2(n)",
        "    block_r = min(triton.next_power_of_2(rows), max(1, 2048 // block_n))",
        "    num_warps = 4 if block_r * block_n <= 2048 else 8 if block_r * block_n <= 8192 else 16",
        f"    {KERNEL_NAME}[(triton.cdiv(rows, block_r),)](",
        f"        {', '.join(inputs)}, {outputs}, rows, n, {row_dims}{strides},",
        "        BLOCK_R=block_r, BLOCK_N=block_n, num_warps=num_warps)",
        f"    return ({outputs},)",
    ]


def _header(region: Region) -> list[str]:
    def size(shape: tuple[int, ...], dtype: torch.dtype) -> int:
        return math.prod(shape) * torch.empty((), dtype=dtype).element_size()

    full, n = region.full_shape, region.n
    shapes = {"full": full, "row": full[:-1] + (1,), "row_flat": full[:-1]}
    read = sum(size(i.shape, i.dtype) for i in region.inputs)
    written = sum(size(shapes[o.kind], o.dtype) for o in region.outputs)
    ops = sum(1 for s in region.steps if s.op != "getitem")
    lines = ["# Generated by kopt.codegen from an FX region; regenerate rather than edit.",
             f"# traced full shape {full}: {math.prod(full[:-1])} rows of N = {n}; {ops} ops; "
             f"reduction: {region.reduction or 'none'}",
             f"# bytes moved at that shape (the memory floor): read {read}, write {written}"]
    for i, tensor in enumerate(region.inputs):
        lines.append(f"# in{i}  <- {tensor.node} {tensor.shape} {str(tensor.dtype).replace('torch.', '')}")
    for k, output in enumerate(region.outputs):
        lines.append(f"# out{k} -> {output.node} ({output.kind}, {str(output.dtype).replace('torch.', '')})")
    return lines


def generate(region: Region) -> str:
    """The full module source for ``region`` (valid Python; imports torch and triton)."""
    n = region.n
    out_specs = ", ".join(f'("{o.kind}", {TORCH_DTYPE_NAMES[o.dtype]})' for o in region.outputs)
    wide = ", ".join(str(_is_wide(i.shape, n)) for i in region.inputs)
    lines = _header(region) + [
        '"""One fused row-wise region: float32 arithmetic, one rounding per output (see reference())."""',
        "",
        "import math",
        "",
        "import torch",
        "import triton",
        "import triton.language as tl",
        "",
        f"OUTPUTS = ({out_specs},)  # (kind, dtype) per output",
        f"RANK = {len(region.full_shape)}",
        f"WIDE_INPUTS = ({wide},)  # which inputs vary along the last dim (the others are one value per row)",
        "",
        "",
    ] + _reference(region) + ["", ""] + _kernel(region) + ["", ""] + _launcher(region)
    return "\n".join(lines) + "\n"
