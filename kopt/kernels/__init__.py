"""kopt.kernels: fused Triton kernels for the DiT hot regions, one kernel per file.

Each file reads top to bottom (Triton-tutorial order):

1. a docstring: what the kernel computes and the bytes it must move (its memory floor);
2. ``reference()``: the eager PyTorch spec, computed in float32 and cast to the output dtype;
3. the ``@triton.jit`` kernel, masked for awkward sizes;
4. ``candidates()`` (launch configs, the heuristic default first) and the launcher, which lets
   ``_autotune`` time them on the first launch of a shape on a GPU and reuse the choice (cached in
   memory and in ``~/.cache/kopt/autotune.json``; ``KOPT_AUTOTUNE=0`` keeps the default);
5. the torch custom op ``kopt::<name>``: CUDA runs the launcher, any other device runs
   ``reference()``, and a fake implementation gives shapes to FakeTensor, torch.compile,
   Inductor and CUDA graphs.

On the CPU the Triton code is tested by calling the launcher under ``TRITON_INTERPRET=1``
(the interpreter cannot run under FakeTensor tracing, hence the launcher and not the op).
Packaged as ``kopt.kernels`` (see pyproject.toml).
"""

from kopt.kernels._triton_cache import share_inductor_ptxas, share_inductor_triton_cache

share_inductor_triton_cache()
share_inductor_ptxas()
