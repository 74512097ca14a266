"""kopt's modules import each other without circles: every import a module makes (at module level or
inside a function; only ``if TYPE_CHECKING`` blocks are left out, they never run) forms a graph with
no cycle. A circle, even one closed by an import inside a function, makes import order matter and hides
which module owns a concept (``kopt.api`` and ``kopt.backend`` once imported each other)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MOUNTS = {"kopt": ROOT / "kopt", "kopt.agent": ROOT / "agent"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in MOUNTS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _import_nodes(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _import_nodes(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _import_nodes([n for n in getattr(node, field, []) if isinstance(n, ast.AST)])


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text()).body):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            targets |= {n for n in names if n in modules and n != name}
        edges[name] = targets
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_static_import_graph_has_no_cycle():
    edges = _edges(_modules())
    assert "kopt.backend" in edges["kopt.api"]  # the graph is read at all
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


@pytest.mark.parametrize("module", ["kopt.api", "kopt.backend", "kopt.compiled_graph"])
def test_each_compile_module_imports_first_in_a_fresh_interpreter(module):
    run = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
