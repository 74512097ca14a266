"""Progress of a compile on stderr (kopt.progress): each step in order, a status line on a terminal,
nothing when turned off, and the same from the command line."""

from __future__ import annotations

import io
import subprocess

import pytest
import torch

import kopt
from kopt.kernels._autotune import Tuner
from kopt.passes.pipeline import default_pipeline


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _steps() -> list[str]:
    """What a one-graph compile reports, in order: tracing, capture, every pass, lowering."""
    passes = [f"graph 0: {p.name} " for p in default_pipeline()]
    return ["tracing Mlp with dynamo", "graph 0: capturing", *passes, "graph 0: captured and rewritten",
            "graph 0: lowered in"]


def _in_order(text: str, steps: list[str]) -> None:
    position = 0
    for step in steps:
        found = text.find(step, position)
        assert found >= 0, f"{step!r} missing after position {position}:\n{text}"
        position = found + len(step)


def _compile_and_call(**options) -> torch.Tensor:
    model = Mlp().eval()
    compiled = kopt.compile(model, lower="eager", **options)
    x = torch.randn(4, 16)
    with torch.no_grad():
        out = compiled(x)
        assert torch.allclose(out, model(x), rtol=1e-5, atol=1e-6)
        compiled(x)  # compiled already: shows nothing more
    return out


def test_each_step_is_shown_in_order_as_plain_lines_off_a_terminal(capsys):
    _compile_and_call(progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines and all(line.startswith("kopt [") for line in lines), captured.err
    _in_order(captured.err, _steps())
    assert len(lines) == len(_steps())  # one line per step, none for the second call


@pytest.mark.parametrize("progress", [False, None], ids=["off", "auto-off-a-terminal"])
def test_off_prints_nothing(capsys, progress):
    _compile_and_call(progress=progress)
    assert capsys.readouterr() == ("", "")


def test_a_terminal_gets_one_status_line_rewritten_in_place(monkeypatch):
    """Auto on a terminal: each step rewrites the line ("\\r", clear), and the last one stays on its own line."""
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    _compile_and_call()
    text = terminal.getvalue()
    assert text.count("\r\x1b[2K") == len(_steps()) and text.count("\n") == 1 and text.endswith("\n")
    _in_order(text, _steps())
    assert text.rsplit("\r\x1b[2K", 1)[1].startswith("kopt [")


def test_auto_leaves_progress_to_logging_that_already_shows_it(monkeypatch, caplog):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with caplog.at_level("INFO", logger="kopt"):
        _compile_and_call()
    assert terminal.getvalue() == ""
    assert any(r.getMessage().startswith("graph 0: lowered in") for r in caplog.records)


_TUNER = Tuner(timer=lambda run: run() or 1.0, enabled=True)


@torch.library.custom_op("kopt_test::tuned_scale", mutates_args=())
def _tuned_scale(x: torch.Tensor) -> torch.Tensor:
    """A kernel that autotunes at its first launch for a shape, through kopt's real tuner."""
    _TUNER.choose("tuned_scale", f"n={x.shape[-1]}", [{"BLOCK": 16}, {"BLOCK": 32}], lambda: lambda c: None,
                  x.device)
    return x * 2.0


_tuned_scale.register_fake(lambda x: torch.empty_like(x))


def test_autotuning_at_the_first_run_is_shown_for_the_torch_compile_backend(capsys, tmp_path, monkeypatch):
    """With backend="kopt" the first run (where kernels autotune) comes after the compile returned."""
    monkeypatch.setattr(_TUNER, "_path", tmp_path / "autotune.json")
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()).eval()

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.kopt_test.tuned_scale(model(x))

    compiled = torch.compile(forward, backend="kopt", options={"lower": "eager", "progress": True})
    x = torch.randn(3, 16)
    with torch.no_grad():
        assert torch.allclose(compiled(x), 2 * model(x))
    err = capsys.readouterr().err
    _in_order(err, ["graph 0: capturing", "graph 0: lowered in", "autotune: tuned_scale [n=16]: 2 configs"])


def _kopt_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["kopt", *argv], capture_output=True, text=True, timeout=600)


def test_the_cli_shows_progress_by_default_and_not_with_no_progress():
    shown = _kopt_cli("explain", "flux2", "--lower", "eager")
    assert shown.returncode == 0, shown.stderr[-2000:]
    _in_order(shown.stderr, ["tracing Flux2Transformer2DModel with dynamo", "graph 0: capturing",
                             "graph 0: staging ", "graph 0: lowered in"])
    quiet = _kopt_cli("explain", "flux2", "--lower", "eager", "--no-progress")
    assert quiet.returncode == 0 and "kopt [" not in quiet.stderr, quiet.stderr[-2000:]
    assert quiet.stdout.count("graph 0") == shown.stdout.count("graph 0")  # the same report on stdout
