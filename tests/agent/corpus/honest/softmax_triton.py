"""region: softmax
expect: accept
convention: out
kind: triton-kernel
max_elements: 8192
why: the Triton tutorial's fused softmax with row blocks and masks, under the Triton interpreter."""
import triton
import triton.language as tl


@triton.jit
def _softmax(x_ptr, out_ptr, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    mask = (r < rows)[:, None] & (c < cols)[None, :]
    x = tl.load(x_ptr + r[:, None] * cols + c[None, :], mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=1)[:, None])
    tl.store(out_ptr + r[:, None] * cols + c[None, :], e / tl.sum(e, axis=1)[:, None], mask=mask)


def candidate(x, out):
    rows, cols = x.shape
    block_c = triton.next_power_of_2(cols)
    block_r = max(1, min(64, 4096 // block_c))
    _softmax[(triton.cdiv(rows, block_r),)](x, out[0], rows, cols, BLOCK_R=block_r, BLOCK_C=block_c)
