"""Regional compilation: compile one instance of each repeated block, reuse its code for the others.

A DiT is dozens of identical blocks (FLUX.1: 19 double-stream + 38 single-stream). Compiling the
whole forward captures, rewrites and lowers every block separately; compiling each block with
``torch.compile`` lets dynamo reuse one compiled graph for every block of a class, because under
``inline_inbuilt_nn_modules`` (the default since torch 2.5) a block's parameters are inputs of its
graph, not constants. kopt is then that graph's backend: it rewrites and lowers the block once, and
:mod:`kopt.weight_sets` keeps each block's own derived tensors (its merged Q/K/V) beside the shared
code. Compile time becomes that of a few blocks instead of the model.

What it gives up: rewrites that need the whole forward cannot fire inside one block — the gated
residual at a block seam, the float32 residual stream, the step-invariant stage that spans blocks —
and the code between blocks runs eagerly. With CUDA graphs on (the default on a GPU), the whole
forward — every block and the code between — is replayed from one CUDA graph
(:mod:`kopt.forward_replay`), so that eager code costs no launches and the host no time per kernel.
Where the forward cannot be recorded (Qwen-Image's copies a host value to the GPU), each block's
graph replays recordings of its own instead, one per block (piecewise); the code between runs eagerly.
The report says which blocks were compiled and what the replay did.

Blocks: the classes a diffusers model declares in ``_repeated_blocks``; otherwise the items of each
outermost ``nn.ModuleList`` whose items have submodules (SD3, Sana, PixArt, transformers LLMs).

``between_blocks="linears"`` also compiles, each on its own, the large linears outside the blocks
(:func:`linears_between_blocks`): an LLM's LM head is 6 % of Llama-3.1-8B's prefill FLOPs (its
4,096 x 128,256 of the model's 8.0 B weights) and runs eagerly otherwise, out of reach of FP8 and
of the agent's choices. Off by default: compiling a lone linear changes nothing by itself and costs
a compile and a guard check per call.

``between_blocks="outer"`` compiles the model's code around the module that runs the blocks, that
module's call opaque to it (:mod:`kopt.between_blocks`): an LLM's LM head with the logit soft cap
after it, as one graph. ``between_blocks="compiled"`` compiles all of the model's own code, each block
call one op in its graph (:mod:`kopt.opaque_blocks`): FLUX.1's guidance scaled without rounding, every
DiT's embeddings and output layers fused. Weights outside the blocks are never released with either.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from kopt.between_blocks import compile_outer, restore_forward, trunk
from kopt.config import WeightChange
from kopt.dynamo_cache import compile_blocks_isolated
from kopt.errors import kopt_errors_unwrapped
from kopt.forward_replay import ForwardReplay
from kopt.fp8.per_block import BlockGroup, block_groups, selecting
from kopt.opaque_blocks import compile_with_opaque_blocks
from kopt.opaque_blocks import restore as restore_block
from kopt.release import Release


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks regional compilation compiles (see the module docstring), in model order."""
    declared = set(getattr(model, "_repeated_blocks", None) or ())
    if declared:
        return [m for m in model.modules() if type(m).__name__ in declared]
    return _outermost_list_items(model)


BETWEEN_BLOCKS = ("eager", "linears", "outer", "compiled")
# A linear with fewer input or output features is no GEMM worth a graph of its own (Fp8Config's default too)
MIN_FEATURES = 1024


def linears_between_blocks(model: nn.Module, min_features: int = MIN_FEATURES) -> list[nn.Linear]:
    """The ``nn.Linear`` modules outside every repeated block with at least ``min_features`` input and
    output features, in model order: an LLM's LM head, a DiT's input, output and modulation projections."""
    inside = {id(m) for block in repeated_blocks(model) for m in block.modules()}
    return [m for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in inside
            and min(m.in_features, m.out_features) >= min_features]


def regional_modules(model: nn.Module, between_blocks: str = "eager") -> list[nn.Module]:
    """What a regional compilation compiles: the repeated blocks, with ``between_blocks="linears"``
    the large linears between them, and with ``"outer"`` the model itself and (made opaque) the module
    that runs the blocks (module docstring)."""
    if between_blocks not in BETWEEN_BLOCKS:
        raise ValueError(f"between_blocks must be one of {BETWEEN_BLOCKS}, got {between_blocks!r}")
    modules = repeated_blocks(model)
    if between_blocks == "outer" and modules:
        holder = trunk(model, modules)
        return modules + ([model] if holder is model else [model, holder])
    if between_blocks == "compiled" and modules:
        return modules + [model]
    return modules + linears_between_blocks(model) if between_blocks == "linears" and modules else modules


def weights_read_outside(model: nn.Module, compiled: list[nn.Module]) -> set[int]:
    """Storages of the parameters and buffers that modules outside every ``compiled`` one hold: what the
    code between the blocks reads, which releasing a compiled module's unread weights must not free (a
    weight can be both: an LM head tied to the embedding, Gemma 2's)."""
    inside = {id(m) for module in compiled for m in module.modules()}
    held = [t for m in model.modules() if id(m) not in inside
            for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))]
    return {t.untyped_storage().data_ptr() for t in held if t.device.type != "meta"}


def _outermost_list_items(module: nn.Module) -> list[nn.Module]:
    items: list[nn.Module] = []
    for child in module.children():
        if isinstance(child, nn.ModuleList):
            items += [item for item in child if next(item.children(), None) is not None]
        else:
            items += _outermost_list_items(child)
    return items


def compile_blocks(model: nn.Module, backend: Callable[..., Any], *, fullgraph: bool = False,
                   dynamic: bool | None = None, isolate: bool = True, between_blocks: str = "eager") -> list[str]:
    """``torch.compile`` each repeated block of ``model`` in place with ``backend`` (and each module of
    :func:`regional_modules` for ``between_blocks``); the class names, sorted. Raises ValueError when
    the model has no repeated blocks.

    ``isolate`` (default): the blocks get dynamo cache state of this compilation's own
    (:func:`kopt.dynamo_cache.compile_blocks_isolated`), so compiling a model again never inherits
    the recompile limit of earlier compilations; False: ``nn.Module.compile`` on each block, exactly
    as diffusers' ``compile_repeated_blocks()`` does (the benchmarks' baseline)."""
    blocks = regional_modules(model, between_blocks)
    if not blocks:
        raise ValueError(f"{type(model).__name__} declares no _repeated_blocks and has no nn.ModuleList of "
                         "blocks: compile it whole (regional=False)")
    repeated = repeated_blocks(model)
    groups = _fp8_groups(model, repeated, backend)
    if between_blocks == "outer":
        if not isolate:
            raise ValueError("between_blocks='outer' compiles with cache state of its own (isolate=True)")
        blocks = repeated  # the names returned are the blocks' classes
        compile_outer(model, blocks, backend, dynamic=dynamic)
        _compile_groups(groups, backend, fullgraph=fullgraph, dynamic=dynamic)
    elif between_blocks == "compiled":
        if not isolate:
            raise ValueError("between_blocks='compiled' compiles with cache state of its own (isolate=True)")
        blocks = repeated  # the names returned are the blocks' classes
        if len(groups) > 1:
            found = "; ".join(f"{len(g.blocks)} block(s): {', '.join(g.selection or ()) or 'none'}" for g in groups)
            raise ValueError("between_blocks='compiled' compiles every block with one graph per class, and this "
                             f"Fp8Config selects different linears in different blocks ({found}): use "
                             "between_blocks='eager', 'linears' or 'outer'")
        selection = groups[0].selection if groups else None
        compile_with_opaque_blocks(model, blocks, backend, fullgraph=fullgraph, dynamic=dynamic,
                                   within=None if selection is None else functools.partial(selecting, selection))
    elif isolate:
        _compile_groups(groups, backend, fullgraph=fullgraph, dynamic=dynamic)
        others = [m for m in blocks if all(m is not b for b in repeated)]  # "linears": the linears between
        if others:
            compile_blocks_isolated(others, backend, fullgraph=fullgraph, dynamic=dynamic)
    else:
        for block in blocks:
            block.compile(backend=backend, fullgraph=fullgraph, dynamic=dynamic)
    return sorted({type(block).__name__ for block in blocks})


def _fp8_groups(model: nn.Module, blocks: list[nn.Module], backend: Any) -> list[BlockGroup]:
    """The repeated blocks, grouped by what the backend's FP8 config selects in each by their paths in
    the model (:mod:`kopt.fp8.per_block`); one group without a selection when it has no FP8 config."""
    config = backend.fp8_config() if hasattr(backend, "fp8_config") else None
    if config is None:
        return [BlockGroup(None, tuple(blocks))] if blocks else []
    return block_groups(model, blocks, config)


def _compile_groups(groups: list[BlockGroup], backend: Any, *, fullgraph: bool, dynamic: bool | None) -> None:
    """Each group's blocks compiled with dynamo cache state of their own, under its FP8 selection."""
    for group in groups:
        within = None if group.selection is None else functools.partial(selecting, group.selection)
        compile_blocks_isolated(list(group.blocks), backend, fullgraph=fullgraph, dynamic=dynamic, within=within)


def uncompile_blocks(model: nn.Module) -> None:
    """Undo :func:`compile_blocks` (``nn.Module.compile`` only sets ``_compiled_call_impl``;
    ``between_blocks="outer"`` also gives the module that runs the blocks a ``forward`` of its own)."""
    for module in model.modules():
        if getattr(module, "_compiled_call_impl", None) is not None:
            module._compiled_call_impl = None
        restore_forward(module)
        restore_block(module)


class KoptRegional(nn.Module):
    """A module whose repeated blocks kopt compiled (:func:`kopt.compile` with ``regional=True``):
    call it like the original; ``kopt_report`` has one graph per compiled block class (and per
    recompilation) and what the whole-forward replay did; ``blocks`` names the block classes."""

    def __init__(self, model: nn.Module, backend: Any, blocks: list[str], replay: bool = False,
                 release_weights: Release = False) -> None:
        super().__init__()
        self._orig_mod = model
        self._kopt_backend = backend
        self.blocks = blocks
        self._release_pending = release_weights
        backend.release_early = release_weights  # each block's weights go once its derived ones exist
        self._replay: ForwardReplay | None = None
        if replay:
            options = backend.options
            check = None if options.on_weight_change is WeightChange.IGNORE else options.weight_check
            self._replay = ForwardReplay(model, backend.weight_guards, lambda: backend.generation, check,
                                         on_disabled=self._replay_blocks)
            backend.report.forward_replay = self._replay.stats

    def _replay_blocks(self, reason: str) -> None:
        """The whole forward could not be recorded: each block's graph replays its own recordings."""
        backend, held_back = self._kopt_backend, self._kopt_backend.graphs_held_back
        backend.graphs_held_back = None
        for graph in backend.report.graphs:
            if graph.cuda_graphs is not None and graph.cuda_graphs.disabled == held_back:
                graph.cuda_graphs.disabled = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with kopt_errors_unwrapped():
            out = self._replay(*args, **kwargs) if self._replay is not None else self._orig_mod(*args, **kwargs)
        release = self._release_pending
        if release:  # the first call ran every block: each has its graph and derived weights
            self._release_pending = False
            self._kopt_backend.release_unread_weights(None if release is True else release)
        return out

    @property
    def kopt_report(self) -> Any:
        """Per compiled block graph: inputs and their roles, each pass's matches, lowering, weights."""
        return self._kopt_backend.report

    def kopt_refresh(self) -> None:
        """Capture and lower again at the next call of each block (the whole-forward recording too)."""
        self._kopt_backend.refresh()

    def undo(self) -> nn.Module:
        """Give back the original module with its blocks uncompiled (warns when ``release_weights``
        freed some of its weights: it cannot run by itself then)."""
        uncompile_blocks(self._orig_mod)
        self._replay = None
        released = self._kopt_backend.report.released_bytes
        if released:
            warnings.warn(f"kopt: {released / 2**20:,.1f} MiB of this module's weights were released after "
                          "compiling (release_weights; on by default with regional fp8): the module given back "
                          "cannot run or be compiled again; compile with release_weights=False to keep them",
                          RuntimeWarning, stacklevel=2)
        return self._orig_mod


def compile_regional(model: nn.Module, backend: Any, *, fullgraph: bool = False,
                     dynamic: bool | None = None, release_weights: Release = False,
                     between_blocks: str = "eager") -> KoptRegional:
    """``model`` with each repeated block compiled by ``backend`` (a :class:`kopt.backend.KoptBackend`).
    When the backend's options ask for CUDA graphs, the whole forward is what is recorded; the blocks'
    graphs record their own (one per block, since each calls with its own weights) only if it cannot be.
    ``release_weights``: free every block's weights no compiled graph reads (:mod:`kopt.release`: the
    bf16 originals of FP8 linears, in each block's weight set) as soon as that block's derived weights
    exist, and whatever is left after the first call: all of them (True), or those on the given device
    types. The first call then peaks near the model's size, not at its bf16 and FP8 weights together.
    ``between_blocks="linears"``: the large linears between the blocks are compiled too (module docstring)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"regional compilation compiles a module's blocks; got {type(model).__name__}")
    replay = backend.options.use_cuda_graphs
    if replay:  # each block's graph waits: it replays only if the whole forward cannot be recorded
        backend.graphs_held_back = "held back: the whole forward is replayed from one CUDA graph (regional)"
        backend.max_graphs = 1024  # then one recording per block (each calls it with its own weights)
    blocks = compile_blocks(model, backend, fullgraph=fullgraph, dynamic=dynamic, between_blocks=between_blocks)
    # "outer": the trunk runs as written; both: what the code outside the blocks reads stays (module docstring)
    outside = between_blocks in ("outer", "compiled")
    compiled = repeated_blocks(model) if outside else regional_modules(model, between_blocks)
    backend.read_outside = weights_read_outside(model, compiled)
    return KoptRegional(model, backend, blocks, replay=replay, release_weights=release_weights)
