"""kopt::capped_attention: the Triton kernels (interpreted on the CPU) against float64 attention on fresh
inputs — soft-cap on and off, grouped-query heads, causal / sliding-window / padding / random masks
broadcast over batch and heads, awkward lengths, every launch config — the skipped-tile spans, NaN
where the model's softmax gives NaN, refused inputs; on a GPU, the Gemma-2-9B prefill shape."""

from __future__ import annotations

import pytest
import torch

from kopt.kernels import capped_attention as mod
from kopt.kernels._autotune import config_name
from tests.conftest import rel_err

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
NEG = float("-inf")


def _qkv(b, h, groups, s_q, s_k, d, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s_q, d, generator=g) * 2
    k = torch.randn(b, h // groups, s_k, d, generator=g)
    v = torch.randn(b, h // groups, s_k, d, generator=g)
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def _mask(kind, s_q, s_k, seed=0, window=5, neg=NEG):
    """An additive (1, 1, S_q, S_k) mask: 0 where a key is seen, ``neg`` where not (-inf, as torch's own
    masks, or the dtype's lowest finite value, as transformers and diffusers build them)."""
    i = torch.arange(s_q)[:, None] + (s_k - s_q)  # queries are the last S_q positions
    j = torch.arange(s_k)[None, :]
    if kind == "causal":
        seen = j <= i
    elif kind == "window":
        seen = (j <= i) & (j > i - window)
    elif kind == "padding":
        seen = (j < s_k - 7).expand(s_q, s_k)
    elif kind == "random":
        g = torch.Generator().manual_seed(seed)
        return torch.randn(1, 1, s_q, s_k, generator=g)
    elif kind == "holes":  # causal, with a band of nonzero values far left of the diagonal and zeros between
        mask = torch.where(j <= i, 0.0, neg)
        mask[:, 2:5] = torch.where(j[:, 2:5] <= i, 0.7, neg)
        return mask[None, None]
    else:
        raise ValueError(kind)
    return torch.where(seen, 0.0, neg)[None, None]


def _exact(q, k, v, bias, scale, softcap):
    return mod.reference(q.double(), k.double(), v.double(), None if bias is None else bias.double(), scale, softcap)


@pytest.mark.parametrize("softcap", [None, 2.0], ids=["plain", "capped"])
@pytest.mark.parametrize("mask", [None, "causal", "window", "padding", "random", "holes"])
def test_kernel_matches_float64_attention(softcap, mask):
    q, k, v = _qkv(2, 4, 2, 37, 53, 16, seed=1)
    bias = None if mask is None else _mask(mask, 37, 53, seed=2)
    out = mod.launch(q, k, v, bias, 0.3, softcap)
    assert out.shape == q.shape
    assert rel_err(out, _exact(q, k, v, bias, 0.3, softcap)) < 1e-5


@pytest.mark.parametrize("config", mod.candidates(16), ids=config_name)
def test_every_launch_config_matches_float64_attention(config):
    q, k, v = _qkv(1, 2, 1, 70, 90, 16, seed=3)
    bias = _mask("window", 70, 90, window=40)
    out = mod.launch(q, k, v, bias, 0.25, 3.0, config=config)
    assert rel_err(out, _exact(q, k, v, bias, 0.25, 3.0)) < 1e-5


@pytest.mark.parametrize("mask", ["causal", "holes", "window"])
def test_long_masks_split_into_tiles_with_and_without_the_mask_match_float64(mask):
    """150 tokens over 32-key tiles: row tiles far from the diagonal run most key tiles without reading the
    mask (causal), or read it from the first tile on (holes), and both give float64's answer."""
    q, k, v = _qkv(1, 2, 1, 150, 150, 16, seed=12)
    bias = _mask(mask, 150, 150, window=70)
    config = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    out = mod.launch(q, k, v, bias, 0.3, 5.0, config=config)
    assert rel_err(out, _exact(q, k, v, bias, 0.3, 5.0)) < 1e-5


def test_bf16_is_closer_to_float64_than_the_model_s_bf16_arithmetic():
    """The kernel keeps logits in float32; the model's eager bf16 attention rounds them at every step
    (logits of a few tens under Gemma 2's cap of 50, where bf16's step is 0.125)."""
    q, k, v = _qkv(1, 4, 2, 64, 64, 32, seed=4, dtype=torch.bfloat16)
    q = q * 8
    bias = _mask("causal", 64, 64)
    exact = _exact(q, k, v, bias, 32 ** -0.5, 50.0)
    out = mod.launch(q, k, v, bias.to(torch.bfloat16), 32 ** -0.5, 50.0)
    kr, vr = (t.repeat_interleave(2, dim=1) for t in (k, v))  # transformers' eager path, in bf16
    s = (q @ kr.transpose(-1, -2)) * 32 ** -0.5
    s = torch.tanh(s / 50.0) * 50.0 + bias.to(torch.bfloat16)
    eager = torch.softmax(s, dim=-1, dtype=torch.float32).to(torch.bfloat16) @ vr
    assert rel_err(out, exact) < rel_err(eager, exact)
    assert rel_err(out, exact) < 1e-2


def test_a_mask_broadcast_per_batch_and_head_uses_each_one_s_rows():
    q, k, v = _qkv(2, 2, 1, 20, 24, 16, seed=5)
    g = torch.Generator().manual_seed(6)
    bias = torch.randn(2, 2, 20, 24, generator=g)
    bias[0, 1, :, 8:] = NEG  # one (batch, head) sees only its first keys
    bias[1, 0, 5:, :16] = NEG
    out = mod.launch(q, k, v, bias, 0.5)
    assert rel_err(out, _exact(q, k, v, bias, 0.5, None)) < 1e-5


def _spans(bias, s, block_m=32, block_n=16):
    """Per row tile: the keys seen [first, end) and, within them, the keys the mask changes, as the kernel
    clips them."""
    tiles = s // block_m
    spans = torch.zeros(mod.SPAN_INTS * tiles, dtype=torch.int32)
    normal = torch.zeros(s, dtype=torch.int32)
    b = bias.expand(1, 1, s, s)
    low = torch.finfo(b.dtype).min
    mod._live_keys_kernel[(1, tiles, s // block_n)](b, spans, normal, low, low / 2, s, s, 1, *b.stride(),
                                                   BLOCK_M=block_m, BLOCK_N=block_n)
    seen_per_row = (b[0, 0] > low / 2).sum(-1).to(torch.int32)
    assert torch.equal(normal, seen_per_row)  # each row's count of keys the mask leaves normal
    out = []
    for first_back, end, masked_back, masked_end in spans.view(tiles, 4).tolist():
        first = s - first_back
        masked_first = min(max(s - masked_back, first), end)
        out.append(((first, end), (masked_first, max(min(masked_end, end), masked_first))))
    return out


@pytest.mark.parametrize("neg", [NEG, torch.finfo(torch.float32).min], ids=["-inf", "finfo.min"])
def test_spans_cover_exactly_the_tiles_with_a_key_seen_and_those_the_mask_changes(neg):
    """The same spans whether the mask writes -inf or the lowest finite value (as transformers' masks
    do: a causal one must skip the tiles above its diagonal in either spelling)."""
    window = _mask("window", 96, 96, window=20, neg=neg)
    window[..., 64:96, :] = neg  # and the last rows see nothing
    # rows 0-31 see keys 0-31; rows 32-63 see keys 13-63 (16-key tiles) and the window's left edge and the
    # diagonal both need the mask there; rows 64-95 see nothing: an empty loop [96, 0)
    assert [seen for seen, _ in _spans(window, 96)] == [(0, 32), (0, 64), (96, 0)]
    assert [masked for _, masked in _spans(window, 96)][:2] == [(0, 32), (0, 64)]
    # a causal mask changes only the tiles on the diagonal: those before it run without reading the mask
    assert _spans(_mask("causal", 96, 96, neg=neg), 96) == [((0, 32), (0, 32)), ((0, 64), (32, 64)),
                                                              ((0, 96), (64, 96))]
    holes = _mask("holes", 96, 96, neg=neg)  # nonzero values on keys 2-4: the mask is read from the first tile on
    assert [masked for _, masked in _spans(holes, 96)] == [(0, 32), (0, 64), (0, 96)]


def test_a_query_row_with_every_key_masked_gives_nan_like_the_model_s_softmax():
    q, k, v = _qkv(1, 1, 1, 8, 8, 16, seed=7)
    bias = torch.zeros(1, 1, 8, 8)
    bias[..., 3, :] = NEG
    out = mod.launch(q, k, v, bias, 0.5)
    model = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + bias, -1) @ v
    assert torch.isnan(out[..., 3, :]).all() and torch.isnan(model[..., 3, :]).all()
    rest = [i for i in range(8) if i != 3]
    assert rel_err(out[..., rest, :], _exact(q, k, v, bias, 0.5, None)[..., rest, :]) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_lowest_finite_masks_skip_tiles_and_match_float64_even_where_a_row_sees_nothing(dtype):
    """transformers' masks: 0 and ``finfo(dtype).min``. Causal rows skip the tiles above the diagonal
    and match float64; a row whose keys are all at the lowest value is no NaN in the model (its softmax
    averages every key), and the kernel attends to every key there too: its row tile does not skip,
    though another row of it sees only the first tile."""
    low = torch.finfo(dtype).min
    q, k, v = _qkv(1, 2, 1, 80, 80, 16, seed=21)
    bias = _mask("causal", 80, 80, neg=low).to(dtype)
    bias[..., 64:, :] = low  # the last row tile: one row sees the first 16 keys, the others nothing
    bias[..., 64, :16] = 0.0
    config = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
    out = mod.launch(q, k, v, bias, 0.5, 50.0, config=config)
    exact = _exact(q, k, v, bias, 0.5, 50.0)
    assert torch.isfinite(exact).all() and torch.isfinite(out).all()
    assert rel_err(out[..., :65, :], exact[..., :65, :]) < 1e-5
    # the masked rows' logits are summed with the lowest value in float32: in float16's -65,504 they
    # keep 8 bits, as in the model's own float32 arithmetic; they average every key, not the 16 of the
    # tile's span
    assert rel_err(out[..., 65:, :], exact[..., 65:, :]) < 1e-2
    spans = _spans(bias[..., :64, :64], 64, block_m=16, block_n=16)  # causal tiles: up to the diagonal's
    assert [seen for seen, _ in spans] == [(0, 16), (0, 32), (0, 48), (0, 64)]


def test_a_nan_in_the_mask_reaches_the_output():
    q, k, v = _qkv(1, 1, 1, 8, 40, 16, seed=8)
    bias = torch.full((1, 1, 8, 40), NEG)
    bias[..., :4] = 0.0
    bias[..., 2, 37] = float("nan")  # in a tile that holds nothing but -inf otherwise
    out = mod.launch(q, k, v, bias, 0.5, config={"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2})
    assert torch.isnan(out[..., 2, :]).all()
    assert not torch.isnan(out[..., [0, 1, 3], :]).any()


def test_output_is_laid_out_as_aten_attention_returns_it():
    q, k, v = _qkv(1, 2, 1, 5, 5, 16, seed=9)
    out = mod.capped_attention(q, k, v, None, 0.5, None)
    assert out.shape == q.shape and out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("bad", ["heads", "dtype", "bias", "softcap"])
def test_refuses_inputs_it_does_not_compute(bad):
    q, k, v = _qkv(1, 4, 2, 8, 8, 16, seed=10)
    bias, softcap = None, None
    if bad == "heads":
        k = v = torch.randn(1, 3, 8, 16)
    elif bad == "dtype":
        v = v.double()
    elif bad == "bias":
        bias = torch.zeros(1, 1, 8, 9)
    elif bad == "softcap":
        softcap = 0.0
    with pytest.raises(ValueError, match="capped_attention"):
        mod.launch(q, k, v, bias, 0.5, softcap)


@needs_cuda
@pytest.mark.gpu
def test_gemma2_prefill_shape_on_the_gpu():
    q, k, v = _qkv(1, 16, 2, 2048, 2048, 256, seed=11, dtype=torch.bfloat16, device="cuda")
    bias = _mask("causal", 2048, 2048).to("cuda", torch.bfloat16)
    out = mod.launch(q, k, v, bias, 256 ** -0.5, 50.0)
    exact = _exact(q, k, v, bias, 256 ** -0.5, 50.0)
    assert rel_err(out, exact) < 1e-2


def test_launch_configs_that_exceed_the_device_s_shared_memory_are_not_tried():
    """The estimate is the request Triton 3.6 made on an H200 for the config it refused (64 × 64 keys,
    head 256, 3 stages: 245,760 bytes against 232,448); with the H200's limit that config is dropped
    and its 2-stage twin kept; with no limit (off CUDA) every config stays."""
    h200 = 232_448
    assert mod.shared_bytes(64, 64, 256, 3) == 245_760
    unlimited, fitting = mod.candidates(256), mod.candidates(256, h200)
    refused = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    assert refused in unlimited and refused not in fitting
    assert {**refused, "num_stages": 2} in fitting
    assert all(mod.shared_bytes(c["BLOCK_M"], c["BLOCK_N"], 256, c["num_stages"]) <= h200 for c in fitting)
    assert mod.candidates(16, h200) == mod.candidates(16)  # small heads fit whatever the tile
