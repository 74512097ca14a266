"""A linear with its bias and tanh-approximated GELU in the GEMM's epilogue:
``y = gelu(x @ W.T + b, approximate="tanh")``.

No Triton kernel: on CUDA this is ``aten._addmm_activation(b, x, W.T, use_gelu=True)``, which runs
cuBLASLt's GELU-bias epilogue (the tanh approximation) on the float32 accumulator, so the bias add
and the GELU cost no extra pass over the (M, N) output; where cuBLASLt declines the shape, ATen
runs ``addmm`` then ``gelu(approximate="tanh")``, the same function. On other devices
``_addmm_activation`` computes the *exact* (erf) GELU, so the op runs :func:`reference` there
instead: one semantics on every device.

Bytes moved (memory floor): read x (M·K), W (N·K) and b (N), write y (M·N); versus the unfused
GEMM + elementwise, which writes y, then reads it and writes it again.
"""

import torch

__all__ = ["linear_gelu_tanh", "reference"]


def reference(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Eager spec: ``addmm`` in the inputs' dtype, then gelu(approximate="tanh")."""
    return torch.nn.functional.gelu(torch.addmm(bias, x, weight_t), approximate="tanh")


@torch.library.custom_op("kopt::linear_gelu_tanh", mutates_args=())
def linear_gelu_tanh(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x @ weight_t + bias, approximate="tanh") for a 2-D ``x`` (M, K), ``weight_t`` (K, N) and
    a 1-D ``bias`` (N); cuBLASLt's epilogue on CUDA, :func:`reference` elsewhere."""
    if x.is_cuda:
        return torch.ops.aten._addmm_activation(bias, x, weight_t, use_gelu=True)
    return reference(x, weight_t, bias)


@linear_gelu_tanh.register_fake
def _(x, weight_t, bias):
    return x.new_empty((x.shape[0], weight_t.shape[1]))
