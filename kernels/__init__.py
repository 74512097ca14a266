"""kopt.kernels: one Triton kernel per file, each with an eager ``reference()`` as its spec.

Packaged as ``kopt.kernels`` (see pyproject.toml); the kernel library arrives with the codegen work.
"""
