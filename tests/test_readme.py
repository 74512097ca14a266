"""Every Python block of README.md runs, top to bottom in one namespace, as a reader would run them.

A block that cannot run on the CPU (it needs CUDA, or full-size weights) is marked by the line right
above its fence, with the reason::

    <!-- readme-test: compile only: needs a CUDA device for cuBLAS' FP8 GEMM -->

and is then only compiled. After each block that ran, every compiled kopt module it left in the
namespace must have compiled without a fallback and without a skipped pass, and every pass the README
itself defines must have fired where it ran: a copied example that quietly does nothing is a failure.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

import kopt

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*compile only:\s*(?P<reason>.*?)\s*-->")


@dataclasses.dataclass(frozen=True)
class Block:
    line: int  # the README line of the block's first line of code (1-based)
    code: str
    compile_only: str | None  # the marker's reason, or None: the block runs


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, with the compile-only marker right above a fence."""
    lines, blocks, index = text.splitlines(), [], 0
    while index < len(lines):
        if lines[index].strip() != "```python":
            index += 1
            continue
        above = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        marker = MARKER.search(above)
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        blocks.append(Block(index + 2, "\n".join(lines[index + 1:end]) + "\n", marker and marker["reason"]))
        index = end + 1
    return blocks


def _compile(block: Block):
    return compile("\n" * (block.line - 1) + block.code, str(README), "exec")  # tracebacks name README lines


def _check_what_ran(namespace: dict, block: Block, checked: set[int]) -> None:
    own_passes = {v.name for v in namespace.values() if isinstance(v, kopt.Pass)} - set(kopt.available_passes())
    for name, value in namespace.items():
        if not isinstance(value, kopt.KoptModule) or id(value) in checked:
            continue
        checked.add(id(value))
        for graph in value.kopt_report.graphs:
            where = f"README.md:{block.line}: {name!r}, graph {graph.index}"
            assert graph.fallback is None, f"{where}: {graph.fallback}"
            skipped = [f"{p.name}: {p.status}" for p in graph.passes if p.status.startswith("skipped")]
            assert not skipped, f"{where}: {skipped}"
            idle = [p.name for p in graph.passes if p.name in own_passes and not p.total_matches]
            assert not idle, f"{where}: the README's pass(es) {idle} did not fire"


def test_every_python_block_runs_in_order():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 3
    namespace: dict = {"__name__": "readme"}
    checked: set[int] = set()
    torch.manual_seed(0)
    for block in blocks:
        code = _compile(block)
        if block.compile_only is not None:
            assert block.compile_only, f"README.md:{block.line}: a compile-only marker must say why"
            continue
        exec(code, namespace)
        _check_what_ran(namespace, block, checked)


def test_a_marked_block_is_compiled_not_run():
    """The marker is read from the line above the fence; such a block still has to be valid Python."""
    text = ("text\n\n```python\nx = 1\n```\n\n<!-- readme-test: compile only: needs CUDA -->\n"
            "```python\nraise SystemExit('ran')\n```\n")
    first, second = python_blocks(text)
    assert (first.line, first.code, first.compile_only) == (4, "x = 1\n", None)
    assert (second.line, second.compile_only) == (9, "needs CUDA")
    _compile(second)
