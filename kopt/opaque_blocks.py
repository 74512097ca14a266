"""Each repeated block's call as one op of the model's graph: ``regional=True, between_blocks="compiled"``.

Regional compilation compiles one graph per block class and runs the code between the blocks as
written. That code cannot be compiled by breaking the graph at each block call: the frame that loops
over the blocks would break inside the loop, and dynamo runs such a frame as written
(:mod:`kopt.between_blocks`). FLUX.1's own ``forward`` computes ``guidance.to(bf16) * 1000`` there
and rounds 3500 to 3504 before its sinusoid (:mod:`kopt.reference`), which a compiled graph would
not; every DiT's embeddings, RoPE tables and output layers run there op by op.

Here the model's ``forward`` is traced whole, and each block call in it becomes one node,
``kopt::opaque_block(handle, variant, tensors)``: the block's ``forward`` is replaced by a function
dynamo traces, which passes the call's tensors to the op. The op runs the block's own compiled code
(one ``torch.compile`` per compilation, shared by every block, as
:func:`kopt.dynamo_cache.compile_blocks_isolated`), so the blocks keep one graph per class and their
weights stay out of the model's graph. What the op needs besides tensors is the call's structure
(which arguments are tensors, tuples of tensors or constants), recorded at trace time under a small
integer (``variant``). Its fake implementation runs the block's forward as written on fake tensors
(shapes, dtypes and symbolic sizes follow the code), and a reference computation
(:func:`kopt.reference.run_reference`) runs the block as written in the reference's precision.

Valid because the op computes exactly the block call it stands for: the same module, the same
arguments rebuilt in order. An output that aliases an input or another output is returned as a copy
(custom ops may not alias); the largest of outputs sharing storage is returned as is. Arguments other
than tensors, tuples or lists of tensors, and constants (None, bool, int, float, str) cannot be
carried: such a call breaks the graph (named in the report's graph breaks) and runs the block's
compiled code as ``"outer"`` would.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from kopt.dynamo_cache import call_module, call_within, compile_fresh
from kopt.fake_block_outputs import call_key, recalled, remember, remembering
from kopt.unit_strides import with_canonical_unit_strides

_handles = itertools.count()
_AS_WRITTEN: contextvars.ContextVar[bool] = contextvars.ContextVar("kopt_blocks_as_written", default=False)
_BLOCKS: dict[int, weakref.ref[nn.Module]] = {}  # handle -> block
_STRUCTURES: dict[int, list[tuple]] = {}  # handle -> call structures, by variant
_LAYOUTS: dict[tuple[int, int], tuple[bool, ...] | None] = {}  # (handle, variant) -> output layout (_outputs)
_MISSING = object()
_CONSTANTS = (type(None), bool, int, float, str)


_TENSOR = ("tensor",)


def _encoded(values: Sequence[Any], tensors: list[torch.Tensor]) -> list[tuple | None]:
    """How the op carries each of ``values`` (None where it cannot), their tensors appended to
    ``tensors`` in order.

    Dynamo steps through this at every block call of the model it traces (57 in FLUX.1), so it is
    one function of plain loops: each generator expression or helper is a nested trace of its own
    (tiny FLUX.1 with its 57 blocks on the CPU, the model's frame: 39.4k bytecode steps with the
    earlier helpers and generator expressions, 25.8k with this loop;
    ``benchmarks/tools/opaque_compile_time.py --model flux1``)."""
    codes: list[tuple | None] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            codes.append(_TENSOR)
            tensors.append(value)
        elif isinstance(value, _CONSTANTS):  # with its type: True == 1, and a call with either is another call
            codes.append(("constant", type(value).__name__, value))
        elif isinstance(value, (tuple, list)):
            code: tuple | None = ("tensors", type(value).__name__, len(value))
            for item in value:
                if not isinstance(item, torch.Tensor):
                    code = None
            if code is not None:
                tensors.extend(value)
            codes.append(code)
        else:
            codes.append(None)
    return codes


def _kopt_block_call_with_arguments_no_op_carries(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return block._kopt_compiled(*args, **kwargs)


# a call whose arguments the op cannot carry (a dict, a cache object, a symbolic int): dynamo breaks the
# graph at it, under this name in the report's graph breaks, and the block still runs its compiled code
_call_as_written = torch.compiler.disable(_kopt_block_call_with_arguments_no_op_carries, recursive=False)


def _rebuild(structure: tuple, tensors: Sequence[torch.Tensor]) -> tuple[list[Any], dict[str, Any]]:
    remaining = iter(tensors)

    def one(code: tuple) -> Any:
        if code[0] == "tensor":
            return next(remaining)
        if code[0] == "tensors":
            items = [next(remaining) for _ in range(code[2])]
            return tuple(items) if code[1] == "tuple" else items
        return code[2]

    positional, named = structure
    return [one(c) for c in positional], {k: one(c) for k, c in named}


@torch._dynamo.assume_constant_result
def _variant(handle: int, structure: tuple) -> int:
    """The number of this call structure for this block (recorded when dynamo traces the call)."""
    known = _STRUCTURES.setdefault(handle, [])
    if structure not in known:
        known.append(structure)
    return known.index(structure)


def _block(handle: int) -> nn.Module:
    block = _BLOCKS[handle]()
    if block is None:
        raise RuntimeError(f"kopt::opaque_block: block {handle} no longer exists")
    return block


def _outputs(handle: int, variant: int, out: Any) -> list[torch.Tensor]:
    """The tensors of a block's output, its layout recorded for :func:`_layout`: a tensor, or a tuple of
    tensors and Nones (SD3's last block returns ``(None, hidden_states)``)."""
    if isinstance(out, torch.Tensor):
        _LAYOUTS[(handle, variant)] = None
        return [out]
    if isinstance(out, tuple) and all(o is None or isinstance(o, torch.Tensor) for o in out):
        _LAYOUTS[(handle, variant)] = tuple(o is not None for o in out)
        return [o for o in out if o is not None]
    raise TypeError(f"between_blocks='compiled': a block returned {type(out).__name__}; an opaque block call "
                    "returns a tensor or a tuple of tensors and Nones")


@torch._dynamo.assume_constant_result
def _layout(handle: int, variant: int) -> tuple[bool, ...] | None:
    """How the call's output is laid out (None: one tensor; else which tuple items are tensors), as the
    op's fake implementation found it while dynamo traced the call."""
    return _LAYOUTS[(handle, variant)]


def _laid_out(outs: Sequence[torch.Tensor], layout: tuple[bool, ...] | None) -> Any:
    if layout is None:
        return outs[0]
    remaining = iter(outs)
    return tuple(next(remaining) if is_tensor else None for is_tensor in layout)


def _unaliased(outs: list[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``outs`` with every output that aliases an input, or a larger output, copied."""
    taken = {t.untyped_storage().data_ptr() for t in inputs}
    keep: dict[int, int] = {}
    for index, out in enumerate(outs):
        storage = out.untyped_storage().data_ptr()
        if storage not in taken and (storage not in keep or outs[keep[storage]].numel() < out.numel()):
            keep[storage] = index
    kept = set(keep.values())
    return [out if index in kept else out.clone() for index, out in enumerate(outs)]


def _keys_a_dispatch_mode_excludes() -> int:
    """The dispatch keys (raw bits) that a call coming through a dispatch mode has excluded and a plain
    call of the op does not: every key above ``Python`` but autograd's (a plain call's implementation
    runs below autograd too) and autocast's (a mode excludes them too, which a plain call does only
    while autocast is off: a block called through a mode under autocast runs without it)."""
    full_after_python = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python).raw_repr()
    above_python = torch._C._dispatch_keyset_full().raw_repr() & ~full_after_python
    excluded = 0
    for bit in range(64):
        key = 1 << bit
        if above_python & key and not any(name in str(torch._C.DispatchKeySet.from_raw_repr(key))
                                          for name in ("Autograd", "Autocast")):
            excluded |= key
    return excluded


_MODE_EXCLUDED = _keys_a_dispatch_mode_excludes()


def _as_a_plain_call() -> contextlib.AbstractContextManager[Any]:
    """The dispatch context a plain call of the op gives its implementation, whichever way it came.

    A dispatch mode that sees the op runs the implementation with every key above ``Python`` excluded
    (AOTAutograd runs a compiled graph's first call under one: its check that custom ops do not alias).
    A block that first compiled there was not rewritten (kopt's capture traces the block with its own
    modes, which those exclusions switch off: it failed, and the block ran Inductor's code of the graph
    as written), and compiled again for plain calls (dynamo guards its inputs' dispatch keys). Valid
    because the implementation runs below autograd either way, and the keys put back are the ones a
    plain call has."""
    excluded = torch._C._dispatch_tls_local_exclude_set().raw_repr()
    if not excluded & _MODE_EXCLUDED:
        return contextlib.nullcontext()
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(),
                                           torch._C.DispatchKeySet.from_raw_repr(excluded & ~_MODE_EXCLUDED))


@torch.library.custom_op("kopt::opaque_block", mutates_args=())
def opaque_block(handle: int, variant: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the block ``handle`` on the call ``variant`` rebuilt from ``tensors`` (module docstring)."""
    from kopt.reference import active_reference_dtype, run_reference

    block = _block(handle)
    args, kwargs = _rebuild(_STRUCTURES[handle][variant], tensors)
    dtype = active_reference_dtype()
    if dtype is not None:  # a reference computation: the block as written, in the reference's precision
        out = run_reference(block._kopt_forward, *args, dtype=dtype, **kwargs)
    elif _AS_WRITTEN.get():  # inside a compile's own checks: no compile of the block inside it
        out = block._kopt_forward(*args, **kwargs)
    else:
        with _as_a_plain_call():
            out = block._kopt_compiled(*args, **kwargs)
    return _unaliased(_outputs(handle, variant, out), tensors)


@opaque_block.register_fake
def _(handle: int, variant: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The block run as written on fake tensors, once per distinct call while one call of the
    compiled model compiles (:mod:`kopt.fake_block_outputs`: a call whose block and arguments match an
    earlier one's takes its outputs' metadata and layout)."""
    from torch._guards import detect_fake_mode

    block = _block(handle)
    structure = _STRUCTURES[handle][variant]
    key = call_key(block, structure, tensors)
    known = recalled(key)
    if known is not None:
        metas, _LAYOUTS[(handle, variant)] = known
        return [torch.empty_strided(size, stride, dtype=dtype, device=device) for size, stride, dtype, device in metas]
    args, kwargs = _rebuild(structure, tensors)
    mode = detect_fake_mode(tensors)
    before = mode.allow_non_fake_inputs if mode is not None else None
    if mode is not None:  # the block's weights are real tensors: the fake mode takes them as they are
        mode.allow_non_fake_inputs = True
    try:
        with torch.no_grad():
            outs = _outputs(handle, variant, block._kopt_forward(*args, **kwargs))
    finally:
        if mode is not None:
            mode.allow_non_fake_inputs = before
    outs = [out.clone() for out in outs]
    remember(key, outs, _LAYOUTS[(handle, variant)])
    return outs


@contextlib.contextmanager
def blocks_as_written() -> Iterator[None]:
    """Opaque block calls run each block as written: while kopt compiles a graph that holds them (its
    verification and lowering check run the graph), so that a block's own compile never starts inside
    another compile, and the check sees the block's computation as the model defines it. Within it,
    block calls share fake runs (:func:`kopt.fake_block_outputs.remembering`)."""
    token = _AS_WRITTEN.set(True)
    try:
        with remembering():
            yield
    finally:
        _AS_WRITTEN.reset(token)


def holds_opaque_blocks(graph_module: torch.fx.GraphModule) -> bool:
    """Whether a graph calls blocks through ``kopt::opaque_block`` (the model's code under
    ``between_blocks="compiled"``)."""
    calls = (torch.ops.kopt.opaque_block, torch.ops.kopt.opaque_block.default)  # dynamo's graph: the packet
    return any(node.op == "call_function" and node.target in calls for node in graph_module.graph.nodes)


# why a graph that calls blocks through the op never records a CUDA graph of its own
CALLS_BLOCKS = ("calls the blocks through kopt::opaque_block: the whole forward is recorded, or else each block "
                "replays its own graphs (one recording of this graph would hold the blocks' kernels too)")


def _handle(block: nn.Module) -> int:
    """The block's handle: assigned at its first compile, kept for its life (graphs name it)."""
    handle = block.__dict__.get("_kopt_handle")
    if handle is None:
        handle = block._kopt_handle = next(_handles)
    _BLOCKS[handle] = weakref.ref(block)
    return handle


def _opaque_forward(block: nn.Module, compiled: Callable[..., Any]) -> None:
    """Give ``block`` a ``forward`` that dynamo traces into one ``kopt::opaque_block`` call, which runs
    ``compiled`` on the block (a block already made opaque keeps the forward it had before)."""
    if not is_opaque(block):
        block._kopt_block_saved_forward = block.__dict__.get("forward", _MISSING)
        block._kopt_forward = block.forward
    block._kopt_compiled = functools.partial(compiled, block)
    handle = _handle(block)

    def kopt_opaque_forward(*args: Any, **kwargs: Any) -> Any:
        tensors: list[torch.Tensor] = []
        codes = _encoded([*args, *kwargs.values()], tensors)
        if None in codes:
            return _call_as_written(block, *args, **kwargs)
        structure = (tuple(codes[:len(args)]), tuple(zip(kwargs, codes[len(args):], strict=True)))
        variant = _variant(handle, structure)
        outs = torch.ops.kopt.opaque_block(handle, variant, tensors)
        layout = _layout(handle, variant)
        if layout is None:
            return outs[0]
        return _laid_out(outs, layout)

    block.forward = kopt_opaque_forward
    _never_a_frame_of_its_own(kopt_opaque_forward.__code__)


@functools.cache
def _never_a_frame_of_its_own(code: types.CodeType) -> None:
    """Dynamo inlines the opaque forward where it traces the model's code; called from code that runs
    as written (a frame dynamo gave up on), it runs as written too: compiled alone it would only wrap
    the op, and each block's handle would turn into a symbolic int at the second block."""
    torch._dynamo.eval_frame.skip_code(code)


def _call_kept_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return self._kopt_forward(*args, **kwargs)


def compile_with_opaque_blocks(model: nn.Module, blocks: list[nn.Module], backend: Callable[..., Any], *,
                               fullgraph: bool, dynamic: bool | None,
                               within: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> None:
    """Compile ``blocks`` (one graph per class) and ``model``'s own code around them, each block's call
    one op in it, with ``backend`` (module docstring); ``within``: a context the blocks' compiled code
    runs in (an FP8 selection: :mod:`kopt.fp8.per_block`)."""
    if any(block is model for block in blocks):
        raise ValueError("the model itself is one of its repeated blocks: there is no code between blocks")
    compiled_block = with_canonical_unit_strides(compile_fresh(_call_kept_forward, "blocks", backend,
                                                               fullgraph=fullgraph, dynamic=dynamic))
    if within is not None:
        compiled_block = functools.partial(call_within, within, compiled_block)
    for block in blocks:
        _opaque_forward(block, compiled_block)
    compiled_model = compile_fresh(call_module, type(model).__name__, backend, fullgraph=False, dynamic=dynamic)
    model._compiled_call_impl = functools.partial(_remembering_call, compiled_model, model)


def _remembering_call(compiled_model: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """One call of the compiled model, its block calls sharing fake runs while dynamo traces and kopt
    compiles in it (:mod:`kopt.fake_block_outputs`)."""
    with remembering():
        return compiled_model(*args, **kwargs)


def is_opaque(module: nn.Module) -> bool:
    """Whether :func:`compile_with_opaque_blocks` made ``module`` an opaque block."""
    return "_kopt_forward" in module.__dict__


def restore(module: nn.Module) -> None:
    """Undo :func:`_opaque_forward`: the forward ``module`` had, and no compiled code of kopt's."""
    if not is_opaque(module):
        return
    saved = module.__dict__.pop("_kopt_block_saved_forward")
    for name in ("_kopt_forward", "_kopt_compiled"):
        module.__dict__.pop(name, None)
    if saved is _MISSING:
        module.__dict__.pop("forward", None)
    else:
        module.forward = saved


def run_as_written(module: nn.Module) -> None:
    """Calls of ``module`` run its own forward until its compiled state is put back
    (:func:`kopt.between_blocks.set_state`)."""
    if is_opaque(module):
        saved = module.__dict__["_kopt_block_saved_forward"]
        if saved is _MISSING:
            module.__dict__.pop("forward", None)
        else:
            module.forward = saved
