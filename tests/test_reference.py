"""kopt.reference: the higher-precision reference every correctness check measures against."""

from __future__ import annotations

import copy

import pytest
import torch

from kopt.reference import ReferenceStats, ReferenceUnavailable, reference_dtype, reference_forward, run_reference
from kopt.verify import relative_error
from tests import tiny_flux1


class Block(torch.nn.Module):
    """A pre-norm transformer block: layer norm, attention, GELU MLP, residuals (no explicit dtypes)."""

    def __init__(self, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(approximate="tanh"),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attention = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.out(attention.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp(self.norm2(x))


def _tiny_stack(depth: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(depth)]).to(torch.bfloat16).eval()


def test_equals_a_full_float64_copy_bit_for_bit():
    """Weights upcast op by op compute exactly what a float64 copy of the whole model computes."""
    model = _tiny_stack()
    x = torch.randn(2, 7, 32).to(torch.bfloat16)
    reference = reference_forward(model, x)
    with torch.no_grad():
        full = copy.deepcopy(model).double()(x.double())
        eager = model(x)
    assert reference.dtype == torch.float64 and torch.equal(reference, full)
    assert relative_error(eager, reference) > 1e-3  # bf16 eager is visibly off: the comparison means something
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the model is left as it was


def test_memory_stays_at_one_layer_of_upcast_weights():
    """The live upcast copies never exceed about one layer, far below an upcast copy of the model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(16)]).to(torch.bfloat16)
    layer = 256 * 256 * 8 + 256 * 8  # one Linear's weight and bias in float64
    stats = ReferenceStats()
    reference_forward(model, torch.randn(4, 256).to(torch.bfloat16), stats=stats)
    assert stats.upcast_bytes >= 16 * layer  # every weight was upcast once...
    assert stats.peak_live_bytes <= 2 * layer  # ...but at most about one layer's copies lived at once
    assert stats.live_bytes == 0  # and none outlives the forward


def test_flux1_guidance_is_not_rounded_and_matches_a_full_copy():
    """On FLUX.1 (guidance 3.5) the reference keeps 3500 where eager bf16 rounds it to 3504: it agrees
    with a float64 copy of the model (which still computes its timestep embedding in float32) to
    float32 precision, and eager bf16 is far from both."""
    model, inputs = tiny_flux1.model_and_inputs(torch.bfloat16, guidance=3.5)
    reference = reference_forward(model, **inputs)[0]
    wide = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        full = copy.deepcopy(model).double()(**wide)[0]
        eager = model(**inputs)[0]
    assert relative_error(reference, full) < 1e-5
    assert relative_error(eager, reference) > 1e-2


def test_casts_to_a_lower_precision_compute_in_the_reference_dtype():
    """``(g.to(bf16) * 1000).sin()``: the reference does not round 3500 to 3504."""
    def embed(g: torch.Tensor) -> torch.Tensor:
        scaled = g.to(torch.bfloat16) * 1000
        return torch.cat([scaled.float().sin(), torch.softmax(scaled, -1, dtype=torch.float32)])

    g = torch.tensor([3.5, 1.25], dtype=torch.float32)
    reference = run_reference(embed, g, upcast_inputs=True)
    exact = g.double() * 1000
    assert torch.equal(reference, torch.cat([exact.sin(), torch.softmax(exact, -1)]))
    assert not torch.allclose(embed(g).double(), reference, atol=1e-2)  # eager is 4 radians off


def test_an_in_place_write_into_a_bf16_buffer_is_refused():
    class Cache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("total", torch.zeros(4, dtype=torch.bfloat16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.total.add_(x)
            return self.total * 2

    cache = Cache()
    with pytest.raises(ReferenceUnavailable, match="writes in place into a stored torch.bfloat16"):
        reference_forward(cache, torch.ones(4, dtype=torch.bfloat16))
    assert torch.equal(cache.total, torch.zeros(4, dtype=torch.bfloat16))


def test_reference_dtype_is_float64_on_the_cpu_and_float32_on_a_gpu_for_bf16():
    assert reference_dtype("cpu", torch.bfloat16) is torch.float64
    assert reference_dtype("cuda", torch.bfloat16) is torch.float32
    assert reference_dtype("cuda", torch.float32) is torch.float64


def test_the_default_dtype_follows_the_narrowest_input_not_the_first(monkeypatch):
    """A bf16 graph whose first input is an fp32 guidance value computes in bf16: on a GPU its reference
    is fp32, not fp64 (which would double the reference's time and memory for nothing)."""
    import kopt.reference

    chosen = []
    monkeypatch.setattr(kopt.reference, "reference_dtype",
                        lambda device, dtype: chosen.append(dtype) or torch.float64)
    run_reference(lambda g, x: g * x, torch.ones(2), torch.ones(2, dtype=torch.bfloat16))
    model = _tiny_stack(1)
    reference_forward(model, torch.randn(1, 3, 32).float().to(torch.bfloat16))
    assert chosen == [torch.bfloat16, torch.bfloat16]


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convolutions_with_weights_left_narrow_equal_a_full_float64_copy(dims, dtype):
    """conv1d/2d/3d compare input and bias dtypes before dispatch; the reference upcasts them first."""
    conv = getattr(torch.nn, f"Conv{dims}d")(3, 5, 2, stride=2).to(dtype)
    x = torch.randn(2, 3, *([6] * dims), dtype=dtype)
    got = reference_forward(conv, x)
    want = copy.deepcopy(conv).double()(x.double())
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=0)
