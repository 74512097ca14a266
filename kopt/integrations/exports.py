"""The integrations' names on the top-level ``kopt`` package, without importing any engine.

``kopt.optimize_pipeline`` imports diffusers when called. ``kopt.kopt_post_grad_pass`` must be an
attribute of the top-level package itself: vLLM resolves a pass named in
``CompilationConfig.inductor_passes`` as ``__import__("kopt").__dict__["kopt_post_grad_pass"]``.
"""

from __future__ import annotations

from typing import Any

from kopt.integrations.inductor_pass import KoptPostGradPass

kopt_post_grad_pass = KoptPostGradPass()  # the default pipeline's post-grad passes, for Inductor users


def optimize_pipeline(pipeline: Any, *args: Any, **kwargs: Any) -> Any:
    """Compile a diffusers pipeline's transformer with kopt, in place (see
    :func:`kopt.integrations.diffusers.optimize_pipeline`); returns the pipeline."""
    from kopt.integrations.diffusers import optimize_pipeline as optimize

    return optimize(pipeline, *args, **kwargs)


def restore_pipeline(pipeline: Any) -> Any:
    """Undo :func:`optimize_pipeline` (see :func:`kopt.integrations.diffusers.restore_pipeline`)."""
    from kopt.integrations.diffusers import restore_pipeline as restore

    return restore(pipeline)
