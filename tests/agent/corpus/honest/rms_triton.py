"""region: rms_norm_modulate
expect: accept
convention: out
kind: triton-kernel
max_elements: 8192
why: one Triton program per block of rows, masked for any width; run by the Triton interpreter on the CPU."""
import triton
import triton.language as tl


@triton.jit
def _rms_modulate(x_ptr, w_ptr, shift_ptr, scale_ptr, out_ptr, rows, seq, width,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, BLOCK_D)
    mask = (r < rows)[:, None] & (d < width)[None, :]
    x = tl.load(x_ptr + r[:, None] * width + d[None, :], mask=mask, other=0.0)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / width + 1e-6)
    w = tl.load(w_ptr + d, mask=d < width, other=0.0)
    batch = r // seq
    scale = tl.load(scale_ptr + batch[:, None] * width + d[None, :], mask=mask, other=0.0)
    shift = tl.load(shift_ptr + batch[:, None] * width + d[None, :], mask=mask, other=0.0)
    y = x * inv[:, None] * w[None, :] * (1.0 + scale) + shift
    tl.store(out_ptr + r[:, None] * width + d[None, :], y, mask=mask)


def candidate(shift, w, x, scale, out):
    batch, seq, width = x.shape
    block_d = triton.next_power_of_2(width)
    block_r = max(1, min(64, 4096 // block_d))
    grid = (triton.cdiv(batch * seq, block_r),)
    _rms_modulate[grid](x, w, shift, scale, out[0], batch * seq, seq, width, BLOCK_R=block_r, BLOCK_D=block_d)
