"""Symbolic shapes: what capture and the passes need to work on dynamo's dynamic graphs.

With ``dynamic=True`` (or after an automatic-dynamic recompile) dynamo hands the backend a graph
whose sizes are symbols (``s50`` for the image tokens), SymInt inputs for them, and FakeTensors
from its own ``FakeTensorMode``, whose ``ShapeEnv`` holds the symbols and the guards that say when
the compiled code may be reused. kopt traces with *those* fakes, in *that* mode, so that:

* every node's ``meta["val"]`` has symbolic sizes, related to dynamo's symbols;
* any guard that capture or a pass adds (a decision that depends on a size) is installed by dynamo
  with the frame's other guards: a later call whose sizes break it recompiles instead of running
  code that is wrong for it (the same contract Inductor relies on);
* passes can ask whether two sizes are provably equal (:func:`known_equal`) without adding a guard,
  and decline a match when they are not (a near miss), instead of specializing the graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import has_free_symbols, statically_known_true

SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic(value: object) -> bool:
    """A SymInt/SymFloat/SymBool, or a tensor with a symbolic size or stride (not a plain number)."""
    if isinstance(value, SYMBOLIC_TYPES):
        return has_free_symbols(value)
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) and has_free_symbols(d) for d in (*value.shape, *value.stride()))
    return False


def dynamo_fakes(dynamo_graph: torch.fx.GraphModule, example_inputs: Sequence[object]) -> list[object] | None:
    """Dynamo's own example value (FakeTensor with symbolic sizes, or SymInt) for each graph input
    when the graph has symbolic sizes; None for a static graph (capture then fakes the real inputs).

    Read from the graph's placeholders (``meta["example_value"]``), not from ``example_inputs``: a
    graph captured again after a weight change gets the call's real tensors, and must stay as
    general as dynamo compiled it."""
    placeholders = [n for n in dynamo_graph.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value") for n in placeholders]
    if not any(is_symbolic(v) for v in [*fakes, *example_inputs]):
        return None
    for position, (fake, value) in enumerate(zip(fakes, example_inputs, strict=True)):
        if isinstance(value, torch.Tensor) and not isinstance(fake, FakeTensor):
            raise ValueError(f"dynamo left no FakeTensor on input {position} of a graph with symbolic shapes")
    return fakes


def fake_mode_of(values: Sequence[object]) -> FakeTensorMode | None:
    """The FakeTensorMode of the first FakeTensor among ``values`` (None if there is none)."""
    for value in values:
        if isinstance(value, FakeTensor):
            return value.fake_mode
    return None


def has_shape_env(mode: FakeTensorMode | None) -> bool:
    return mode is not None and mode.shape_env is not None


@contextlib.contextmanager
def allowing_real_constants(mode: FakeTensorMode) -> Iterator[FakeTensorMode]:
    """``mode`` while it accepts real tensors (the frozen weights a graph closes over) as inputs.
    Dynamo's mode refuses them; kopt's constants are real by design (they become ``get_attr``)."""
    previous = mode.allow_non_fake_inputs
    mode.allow_non_fake_inputs = True
    try:
        yield mode
    finally:
        mode.allow_non_fake_inputs = previous


def tensorified_scalar(fake: object) -> str | None:
    """The symbol (``zf35``) of a Python float that dynamo passes as a 0-d tensor whose ``item()``
    is symbolic (the FakeTensor's ``item_memo``); None for anything else."""
    if not isinstance(fake, FakeTensor) or fake.dim() != 0:
        return None
    memo = getattr(fake, "item_memo", None)
    expr = getattr(getattr(memo, "node", None), "_expr", None)
    return getattr(expr, "name", None) if isinstance(memo, torch.SymFloat) else None


def restart_specializing(symbols: Sequence[str]) -> None:
    """Have dynamo trace the frame again with these float symbols specialized to their values.

    This is how Inductor specializes the floats it cannot keep symbolic: the symbols go into
    dynamo's ``TensorifyState`` and ``TensorifyScalarRestartAnalysis`` restarts the analysis, which
    then replaces each such input by its value, guarded. Symbols already requested are skipped (the
    frame was retraced and kept them: asking again would restart forever)."""
    from torch._dynamo.exc import TensorifyScalarRestartAnalysis
    from torch._dynamo.symbolic_convert import TensorifyState

    new = [name for name in symbols if not TensorifyState.should_specialize(name)]
    if not new:
        return
    for name in new:
        TensorifyState.specialize(name)
    raise TensorifyScalarRestartAnalysis


def known_equal(a: Any, b: Any) -> bool:
    """``a == b`` provably for every size the graph may be called with (adds no guard). Sizes are
    ints or SymInts; anything else (an FX node standing for a size) is equal only to itself."""
    numbers = (int, float, torch.SymInt, torch.SymFloat)
    if not (isinstance(a, numbers) and isinstance(b, numbers)):
        return a is b
    if isinstance(a, (torch.SymInt, torch.SymFloat)) or isinstance(b, (torch.SymInt, torch.SymFloat)):
        return statically_known_true(a == b)
    return bool(a == b)


def static_int(value: Any) -> int | None:
    """``value`` as a plain int when it is one (or a SymInt that dynamo specialized), else None."""
    if isinstance(value, int):
        return value
    if isinstance(value, torch.SymInt) and not has_free_symbols(value):
        return int(value)
    return None


def concrete(value: object) -> object:
    """A runnable stand-in for an example input: the size a SymInt had on this call (its hint)."""
    if isinstance(value, torch.SymInt):
        return value.node.hint if value.node.hint is not None else int(value)
    return value


@contextlib.contextmanager
def fake_mode_for(value: object) -> Iterator[None]:
    """Run tensor code on ``value``'s FakeTensorMode (needed to build a fake with ``value``'s
    symbolic sizes by hand); a no-op for anything else."""
    mode = value.fake_mode if isinstance(value, FakeTensor) else None
    with mode if mode is not None else contextlib.nullcontext():
        yield


def lowering_examples(graph_module: torch.fx.GraphModule, real_args: Sequence[object]) -> list[object]:
    """Example inputs to lower ``graph_module`` with: when its sizes are symbolic, fakes in the mode
    of its symbols (Inductor then compiles one kernel set for every size): each placeholder's own,
    or, for one that has none in that mode (a weight made an input after capture), a static fake of
    its real value; for a static graph, ``real_args`` (see :func:`_static_in_dynamo`)."""
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("val") for n in placeholders]
    symbolic = [v for v in fakes if is_symbolic(v)]
    if not symbolic:
        return _static_in_dynamo(real_args)
    mode = fake_mode_of(symbolic) or _mode_of_symbols(symbolic, fakes)
    examples: list[object] = []
    for fake, real in zip(fakes, real_args, strict=True):
        if isinstance(fake, SYMBOLIC_TYPES) or (isinstance(fake, FakeTensor) and fake.fake_mode is mode):
            examples.append(fake)
        elif mode is not None and isinstance(real, torch.Tensor):  # an alias: the mode memoizes tensors
            examples.append(mode.from_tensor(real.detach(), static_shapes=True))
        else:
            examples.append(real)
    return examples


def _mode_of_symbols(symbolic: Sequence[object], fakes: Sequence[object]) -> FakeTensorMode | None:
    """The fake mode of a graph whose only symbolic inputs are sizes (SymInts: the step-invariant
    stage of a dynamic graph, whose tensors have fixed sizes): the mode, among its placeholders'
    fakes or the tracing context's, whose shape env holds those symbols. A fake of another mode (a
    constant's, made when a pass added it) would leave the sizes' symbols foreign to Inductor."""
    shape_env = next((v.node.shape_env for v in symbolic if isinstance(v, SYMBOLIC_TYPES)), None)
    context = torch._guards.TracingContext.try_get()
    candidates = [v.fake_mode for v in fakes if isinstance(v, FakeTensor)] + [getattr(context, "fake_mode", None)]
    return next((m for m in candidates if m is not None and m.shape_env is shape_env and shape_env is not None), None)


def _static_in_dynamo(real_args: Sequence[object]) -> list[object]:
    """``real_args``, except that inside a dynamo compile each tensor dynamo did not trace (a weight made
    an input, a hoisted value) becomes a static fake of dynamo's mode.

    Why: Inductor fakes a real input it is given in the tracing context's mode, with a fresh size
    symbol per dimension unless dynamo traced that tensor. A guard a kernel then needs on such a
    symbol (a reshape's size check) lands among the frame's guards with no source to read it from,
    and dynamo fails to build the frame's guards. A static fake has plain sizes: no symbol, no guard.
    """
    context = torch._guards.TracingContext.try_get()
    mode = getattr(context, "fake_mode", None)
    if mode is None or mode.shape_env is None:
        return list(real_args)
    traced = context.tensor_to_context
    return [mode.from_tensor(arg.detach(), static_shapes=True)
            if isinstance(arg, torch.Tensor) and not isinstance(arg, FakeTensor) and arg not in traced else arg
            for arg in real_args]


def same_sizes(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Two shapes provably equal for every size the graph may be called with (adds no guard)."""
    return len(a) == len(b) and all(known_equal(x, y) for x, y in zip(a, b, strict=True))


def shape_in(shape: Sequence[Any], candidates: Sequence[Sequence[Any]]) -> bool:
    """``shape`` provably equals one of ``candidates`` (see :func:`same_sizes`)."""
    return any(same_sizes(shape, candidate) for candidate in candidates)


def shape_env_of(graph_module: torch.fx.GraphModule) -> Any:
    """The ShapeEnv behind a graph's symbolic placeholders, or None for a static graph."""
    values = [n.meta.get("val") for n in graph_module.graph.nodes if n.op == "placeholder"]
    mode = fake_mode_of(values)
    if not any(is_symbolic(v) for v in values):
        return None
    if mode is not None and mode.shape_env is not None:
        return mode.shape_env
    symbols = [v for v in values if isinstance(v, SYMBOLIC_TYPES)]
    return symbols[0].node.shape_env if symbols else None


def dynamo_shape_env(dynamo_graph: torch.fx.GraphModule) -> Any:
    """The ShapeEnv of a dynamo graph with symbolic sizes (from its placeholders' example values);
    None for a static graph."""
    values = [n.meta.get("example_value") for n in dynamo_graph.graph.nodes if n.op == "placeholder"]
    if not any(is_symbolic(v) for v in values):
        return None
    mode = fake_mode_of(values)
    return mode.shape_env if mode is not None else None


def guards_since(shape_env: Any, count: int) -> list[str]:
    """The guards ``shape_env`` gained after it had ``count`` (each a condition on the sizes)."""
    if shape_env is None:
        return []
    return [str(guard.expr) for guard in shape_env.guards[count:]]


def baked_sizes(graph: torch.fx.Graph) -> list[str]:
    """Nodes whose arguments hold a SymInt/SymFloat object instead of a node computing it.

    make_fx records every symbolic size as a node (``sym_size``, ``operator.mul``...); a pass that
    copies a size from ``meta["val"]`` into a new node's arguments would freeze the size of the call
    it was traced on (the generated code names a symbol no one defines). Such a graph is refused."""
    found = []
    for node in graph.nodes:
        symbols: list[str] = []

        def note(arg: Any, symbols: list[str] = symbols) -> Any:
            if isinstance(arg, SYMBOLIC_TYPES) and has_free_symbols(arg):
                symbols.append(str(arg))
            return arg

        torch.fx.node.map_aggregate((node.args, node.kwargs), note)
        if symbols:
            found.append(f"{node.name} ({', '.join(symbols)})")
    return found
