"""The integrations' names on the top-level ``kopt`` package, without importing any engine.

``kopt.optimize_pipeline`` imports diffusers when called. ``kopt.kopt_post_grad_pass`` must be an
attribute of the top-level package itself: vLLM resolves a pass named in
``CompilationConfig.inductor_passes`` as ``__import__("kopt").__dict__["kopt_post_grad_pass"]``.
"""

from __future__ import annotations

from typing import Any


class _PostGradPassOnFirstUse:
    """``kopt.kopt_post_grad_pass``: a :class:`~kopt.integrations.inductor_pass.KoptPostGradPass`, made
    on first use, because its base class lives in ``torch._inductor``, whose import (with dynamo) takes
    seconds that ``import kopt`` must not spend. Everything is forwarded to the pass, and ``__class__``
    names the pass's class, so ``isinstance`` checks (Inductor's, for its FX graph cache key) see it."""

    _pass: Any = None

    def _get(self) -> Any:
        if _PostGradPassOnFirstUse._pass is None:
            from kopt.integrations.inductor_pass import KoptPostGradPass

            _PostGradPassOnFirstUse._pass = KoptPostGradPass()
        return _PostGradPassOnFirstUse._pass

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105
        return type(self._get())

    def __call__(self, graph: Any) -> None:
        self._get()(graph)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get(), name, value)

    def __deepcopy__(self, memo: dict[int, Any]) -> _PostGradPassOnFirstUse:
        return self

    def __reduce__(self) -> str:
        return "kopt_post_grad_pass"  # pickled by name: kopt.kopt_post_grad_pass in the receiving process


kopt_post_grad_pass = _PostGradPassOnFirstUse()  # the default post-grad passes, for Inductor and vLLM users


def optimize_pipeline(pipeline: Any, *args: Any, **kwargs: Any) -> Any:
    """Compile a diffusers pipeline's transformer with kopt, in place (see
    :func:`kopt.integrations.diffusers.optimize_pipeline`); returns the pipeline."""
    from kopt.integrations.diffusers import optimize_pipeline as optimize

    return optimize(pipeline, *args, **kwargs)


def restore_pipeline(pipeline: Any) -> Any:
    """Undo :func:`optimize_pipeline` (see :func:`kopt.integrations.diffusers.restore_pipeline`)."""
    from kopt.integrations.diffusers import restore_pipeline as restore

    return restore(pipeline)
