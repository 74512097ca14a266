"""The regions of the frozen verifier corpus: small, CPU-feasible, resizable, each with the contract
its candidates are held to. ``CANONICAL`` pins each region's canonical input order (the order every
candidate in the corpus takes its arguments in); a test checks it still holds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from kopt.agent import region as regions
from kopt.passes.base import Contract


@dataclasses.dataclass(frozen=True)
class CorpusRegion:
    name: str
    fn: Callable
    examples: Callable[[], tuple[torch.Tensor, ...]]
    contract: Contract
    canonical: tuple[str, ...]  # the candidate's argument names, in the region's canonical input order

    def build(self) -> regions.Region:
        return regions.from_function(self.fn, *self.examples())


def _rms_norm_modulate(x, w, shift, scale):
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + 1e-6) * w * (1 + scale) + shift


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _layer_norm_stats(x):
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    return (x - mean) * rstd, mean, rstd


def _gelu_bias(x, b):
    return torch.nn.functional.gelu(x + b, approximate="tanh")


def _linear_bias(x, w, b):
    return x @ w.t() + b


def _silu_mul(a, b):
    return torch.nn.functional.silu(a) * b


def _row_sum(x):
    return x.sum(-1)


def _copy(x):
    return x.clone()


def _relu(x):
    return torch.relu(x)


def _add_pair(x, y):
    s = x + y
    return s, s * 1.0


def _f32(*shape):
    return torch.randn(*shape)


REGIONS = {r.name: r for r in (
    CorpusRegion("rms_norm_modulate", _rms_norm_modulate,
                 lambda: (_f32(2, 24, 64), _f32(64), _f32(2, 1, 64), _f32(2, 1, 64)),
                 Contract.tolerance(1e-5), ("shift", "w", "x", "scale")),
    CorpusRegion("softmax", _softmax, lambda: (_f32(48, 80),), Contract.tolerance(1e-5), ("x",)),
    CorpusRegion("layer_norm_stats", _layer_norm_stats, lambda: (_f32(40, 96),), Contract.tolerance(1e-5), ("x",)),
    CorpusRegion("gelu_bias", _gelu_bias, lambda: (_f32(64, 96), _f32(96)), Contract.tolerance(1e-5), ("b", "x")),
    CorpusRegion("linear_bias", _linear_bias, lambda: (_f32(32, 96), _f32(80, 96), _f32(80)),
                 Contract.tolerance(1e-5), ("b", "x", "w")),
    CorpusRegion("linear_bias_fp8", _linear_bias, lambda: (_f32(32, 96), _f32(80, 96), _f32(80)),
                 Contract.quality(min_cosine=0.995, rel_tol=0.08), ("b", "x", "w")),
    CorpusRegion("silu_mul_bf16", _silu_mul,
                 lambda: (_f32(64, 128).bfloat16(), _f32(64, 128).bfloat16()), Contract.tolerance(4e-3), ("a", "b")),
    CorpusRegion("row_sum", _row_sum, lambda: (_f32(64, 200),), Contract.tolerance(1e-5), ("x",)),
    CorpusRegion("copy", _copy, lambda: (_f32(32, 48),), Contract.exact(), ("x",)),
    CorpusRegion("relu", _relu, lambda: (_f32(48, 64),), Contract.exact(), ("x",)),
    CorpusRegion("add_pair", _add_pair, lambda: (_f32(32, 64), _f32(32, 64)), Contract.tolerance(1e-6), ("x", "y")),
)}
