"""The wheel: what ``pip install .`` installs must hold every module of the checkout.

An editable install reads the source tree and hides a package missing from the wheel's package list;
this test builds the real wheel and compares it with what git tracks under ``kopt/`` and ``agent/``
(``kopt.agent``). ``.ci/run`` also installs that wheel in a fresh
venv and compiles a model with it from outside the checkout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
MOUNTS = {"kopt": "kopt", "agent": "kopt/agent"}  # folder -> path in the wheel


def _tracked(folder: str) -> list[str]:
    """Files git tracks under ``folder`` (the file tree's own ``.py`` files outside a git checkout)."""
    if (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "--", folder], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
        return [line for line in out.splitlines() if line]
    return [str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]


NEW_SUBPACKAGE = "_added_later"  # put in each folder's copy: discovery must find what no list names yet


def _build_wheel(tmp_path: Path) -> Path:
    """Build from a copy of the tracked sources (no stale ``build/`` of the checkout can leak in), with a
    new subpackage ``_added_later/deeper`` in each of kopt/ and agent/."""
    source = tmp_path / "src"
    top_level = [p for p in ("pyproject.toml", "setup.py", "README.md") if (ROOT / p).exists()]
    for relative in top_level + [f for folder in MOUNTS for f in _tracked(folder)]:
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, source / relative)
    for folder in MOUNTS:
        deeper = source / folder / NEW_SUBPACKAGE / "deeper"
        deeper.mkdir(parents=True)
        for package in (deeper.parent, deeper):
            (package / "__init__.py").write_text('"""A subpackage no list names."""\n')
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                             "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("kopt-*.whl")
    return wheel


def test_the_wheel_holds_every_tracked_module(tmp_path):
    """Every file git tracks under kopt/ and agent/ is in the wheel at its installed path, and so is
    a subpackage added to any of them; the console script and the dynamo backend are declared."""
    wheel = zipfile.ZipFile(_build_wheel(tmp_path))
    names = set(wheel.namelist())
    expected = {MOUNTS[f.split("/", 1)[0]] + "/" + f.split("/", 1)[1] for folder in MOUNTS for f in _tracked(folder)}
    assert len(expected) > 70  # the checkout's modules were found
    missing = sorted(expected - names)
    assert not missing, f"{len(missing)} tracked file(s) not in the wheel: {missing}"
    added = {f"{MOUNTS[folder]}/{NEW_SUBPACKAGE}/{sub}__init__.py" for folder in MOUNTS for sub in ("", "deeper/")}
    assert added <= names, f"new subpackages not discovered: {sorted(added - names)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "kopt = kopt.cli:main" in text and "kopt = kopt.backend:kopt_backend" in text


def test_every_declared_dependency_is_imported():
    """A runtime dependency nothing imports is dead weight for every user: each one is imported somewhere."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    sources = "\n".join(p.read_text() for folder in MOUNTS for p in (ROOT / folder).rglob("*.py"))
    for requirement in declared:
        module = re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].replace("-", "_")
        assert re.search(rf"^\s*(import|from) {module}\b", sources, re.MULTILINE), f"{requirement} is never imported"


def test_no_folder_of_the_checkout_shadows_an_installed_package():
    """pytest and ``python`` run from the checkout put its root first on ``sys.path``, so a top-level
    package folder named like another distribution's module hides that module from everything that
    imports it (transformers imports Hugging Face's ``kernels``: a top-level ``kernels/`` broke it)."""
    import importlib.metadata

    owners = importlib.metadata.packages_distributions()
    folders = [p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()]
    assert "kopt" in folders
    shadowing = {name: owners[name] for name in folders if name != "kopt" and name in owners}
    assert not shadowing, f"checkout folders named like installed modules: {shadowing}"
