"""kopt inside the engines people serve models with, through each engine's own extension points.

- :mod:`kopt.integrations.diffusers`: :func:`optimize_pipeline` (also ``kopt.optimize_pipeline``)
  compiles a diffusers pipeline's transformer with kopt, in place, and can undo it.
- :mod:`kopt.integrations.sglang`: a plugin of SGLang's diffusion runtime (entry point group
  ``sglang.multimodal_gen.plugins``) that swaps kopt's backend in where SGLang compiles the DiT with
  Inductor.
- :mod:`kopt.integrations.vllm`: kopt's passes as vLLM's Inductor post-grad pass
  (``CompilationConfig.inductor_passes``) and a ``vllm.general_plugins`` entry point.
- :mod:`kopt.integrations.inductor_pass`: the engine-neutral Inductor post-grad pass both use.

Each engine module imports only when its engine is installed and says how to install it otherwise
(:func:`require`). Each checks the engine's version against the range it was tested with and steps
aside (logs why, changes nothing) on any other.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.version import Version


class EngineMissing(ImportError):
    """The engine an integration plugs into is not installed."""


def require(module: str, distribution: str, extra: str) -> ModuleType:
    """Import ``module`` of ``distribution``, or raise :class:`EngineMissing` saying what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise EngineMissing(f"kopt.integrations.{extra} needs {distribution}, which is not importable "
                            f"({error}); install it with: pip install 'kopt[{extra}]'") from error


def installed_version(*distributions: str) -> Version | None:
    """The installed version of the first of ``distributions`` that is installed (None: none is)."""
    from packaging.version import Version  # every engine depends on packaging; kopt itself does not

    for name in distributions:
        try:
            return Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def unsupported_reason(engine: str, version: Version | None, minimum: str, below: str) -> str | None:
    """Why kopt steps aside for ``engine`` at ``version`` (None: supported, ``minimum <= version < below``)."""
    from packaging.version import Version

    if version is None:
        return f"{engine} is not installed"
    if Version(minimum) <= version < Version(below):
        return None
    return (f"{engine} {version} is outside the versions kopt's {engine} integration was tested with "
            f"(>= {minimum}, < {below}): it hooks {engine}'s internal functions, whose names and arguments "
            f"change between releases; kopt steps aside and {engine} runs as it would without kopt")
