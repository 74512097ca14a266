"""kopt in SGLang's diffusion runtime: a plugin that compiles the DiT with kopt's backend.

SGLang discovers plugins through the entry point group ``sglang.multimodal_gen.plugins`` (kopt's is
:func:`register`) and runs them in every process (HTTP server, CLI, each GPU worker) before it builds
models. The plugin installs one hook through SGLang's own hook registry: AFTER
``sglang.multimodal_gen.runtime.utils.torch_compile.build_torch_compile_kwargs``, the one function
every DiT compile of SGLang goes through (``--enable-torch-compile``, whole-model or regional).
When those kwargs would compile with Inductor (no backend, or ``"inductor"``), kopt puts its own
backend in: kopt captures the DiT, runs its passes and lowers the result with Inductor. Other backends
(NPU's torchair, an out-of-tree platform's) are left alone.

Why kopt's backend and not an Inductor post-grad pass: Inductor's post-grad graph has the weights as
inputs and its decompositions applied, so the weight-level rewrites (merged Q/K/V and modulation
GEMMs, FP8 weights quantized once, folded RoPE tables) and the step-invariant memo, which make most
of kopt's gain on Qwen-Image and FLUX.2, are impossible there. SGLang's ``mode`` (default
``max-autotune-no-cudagraphs``) is an Inductor mode; kopt lowers with Inductor's defaults and the log
says the mode was not applied.

SGLang's layers call opaque fused ops (``sglang::fused_norm_scale_shift`` on CUDA); the backend's
first pass, :class:`~kopt.integrations.sglang_ops.ExpandSglangOps`, expands those it understands
into ATen so kopt's fusions match them, and lists the others in the report.

Switch: ``KOPT_SGLANG=0`` leaves SGLang's compile as it is; ``KOPT_SGLANG_OPTIONS`` takes a JSON
object of :func:`kopt.compile` keywords (``'{"fp8": true}'``, ``'{"verify": true}'``). On an SGLang
release outside the tested range the plugin steps aside (logged).
Anything kopt fails at is logged and SGLang compiles as it would without kopt: a failure building the
backend keeps SGLang's kwargs; a pass that raises is skipped and a failed capture or lowering runs
the original graph (kopt's backend's own rules).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from kopt.integrations import installed_version, require, unsupported_reason

require("sglang.multimodal_gen", "sglang", "sglang")

log = logging.getLogger("kopt")
# Versions: tested with 0.5.23 (CI). What the plugin relies on is SGLang-internal: the entry point group and
# ``plugin_hook`` of ``sglang.multimodal_gen.runtime.platforms.plugins`` (absent in 0.5.18: the plugin would
# never load), ``build_torch_compile_kwargs(*, mode, module, ...)`` returning torch.compile's kwargs, and the
# op names ExpandSglangOps expands. 0.5.22's wheel has all of them unchanged, but was not run; any other
# release is refused (the plugin steps aside) until it is tested.
TESTED = ("0.5.23", "0.5.24")
HOOK_TARGET = "sglang.multimodal_gen.runtime.utils.torch_compile.build_torch_compile_kwargs"
SWITCH, OPTIONS = "KOPT_SGLANG", "KOPT_SGLANG_OPTIONS"


def disabled_reason() -> str | None:
    """Why the plugin must not install its hook (None: it may)."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    return unsupported_reason("sglang", installed_version("sglang"), *TESTED)


def with_kopt_backend(compile_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """The AFTER hook: ``compile_kwargs`` with kopt's backend when they would compile with Inductor."""
    if compile_kwargs.get("backend", "inductor") != "inductor" or os.environ.get(SWITCH, "1") == "0":
        return None  # another backend, or switched off at run time: SGLang's kwargs as they are
    try:
        from kopt.backend import make_backend
        from kopt.integrations.sglang_ops import ExpandSglangOps

        options = json.loads(os.environ.get(OPTIONS) or "{}")
        backend = make_backend([ExpandSglangOps(), *options.pop("passes", ["auto"])], **options)
    except Exception as error:  # noqa: BLE001 - SGLang must compile without kopt rather than fail
        log.warning("kopt's SGLang plugin could not build its backend (%s: %s); SGLang compiles as usual",
                    type(error).__name__, error)
        return None
    mode = compile_kwargs.get("mode")
    patched = {key: value for key, value in compile_kwargs.items() if key not in ("mode", "options")}
    patched["backend"] = backend
    LAST_BACKENDS.append(backend)
    log.info("kopt compiles SGLang's DiT (Inductor mode %r not applied: kopt lowers with Inductor's defaults)", mode)
    return patched


LAST_BACKENDS: list[Any] = []  # the backends this process handed to SGLang, newest last (their reports)


def register() -> None:
    """The ``sglang.multimodal_gen.plugins`` entry point: install the hook through SGLang's registry."""
    reason = disabled_reason()
    if reason is not None:
        log.warning("kopt's SGLang plugin steps aside: %s", reason)
        return
    from sglang.multimodal_gen.runtime.platforms.plugins import HookType, plugin_hook

    plugin_hook(HOOK_TARGET, HookType.AFTER)(with_kopt_backend)
