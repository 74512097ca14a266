"""Register a generated module as the torch op ``kopt::gen_<key>`` (CUDA: Triton; CPU: reference).

The schema is built from the region (``gen_<key>(Tensor in0, ...) -> (Tensor, ...)``), so the op
is defined with ``torch.library.Library.define`` plus ``impl`` per dispatch key and
``register_fake``: ``custom_op`` infers its schema from a Python signature, which a generated
region does not have. The op is functional (fresh outputs, no aliasing, no mutation) and its fake
implementation allocates the same contiguous outputs the kernel does, which is what lets
torch.compile and Inductor carry it as an opaque call while fusing the code around it. The key is a
content hash, so registering the same region again returns the op already defined.
"""

from __future__ import annotations

import threading
import types

import torch

_LIBRARY = torch.library.Library("kopt", "FRAGMENT")
_OPS: dict[str, torch._ops.OpOverload] = {}
_LOCK = threading.Lock()


def op_name(key: str) -> str:
    """The op's name in the ``kopt`` namespace for a cache key."""
    return f"gen_{key[:16]}"


def _single_or_tuple(outputs: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
    return outputs[0] if len(outputs) == 1 else outputs


def register(key: str, module: types.ModuleType, num_inputs: int) -> torch._ops.OpOverload:
    """``torch.ops.kopt.gen_<key>.default`` running ``module`` (defined on first call only)."""
    name = op_name(key)
    with _LOCK:
        if name in _OPS:
            return _OPS[name]
        if not hasattr(torch.ops.kopt, name):
            arguments = ", ".join(f"Tensor in{i}" for i in range(num_inputs))
            count = len(module.OUTPUTS)
            returns = "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"
            _LIBRARY.define(f"{name}({arguments}) -> {returns}")

            def run_triton(*inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
                return _single_or_tuple(module.launch(*inputs))

            def run_reference(*inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
                return _single_or_tuple(module.reference(*inputs))

            def fake(*inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
                full = torch.broadcast_shapes(*(t.shape for t in inputs))
                return _single_or_tuple(module.empty_outputs(full, inputs[0].device))

            _LIBRARY.impl(name, run_triton, "CUDA")
            _LIBRARY.impl(name, run_reference, "CPU")
            torch.library.register_fake(f"kopt::{name}", fake, lib=_LIBRARY)
        _OPS[name] = getattr(torch.ops.kopt, name).default
        return _OPS[name]
