"""Fuse an attention the model spells out (``fuse-attention``): two batched products around a softmax,
with a soft-cap and a mask in any spelling, become one ``kopt::capped_attention`` reading the keys
and values unrepeated; the result matches float64 on fresh inputs. Attentions whose logits or
probabilities are read elsewhere, a softmax over another dim, a step after the mask, and a negative
"cap" are left alone with their reason. On tiny Gemma 2 (soft-capped, grouped-query, sliding
window) the one block graph fires once and the model stays as close to float64 as eager."""

from __future__ import annotations

import copy

import pytest
import torch

import kopt
from kopt.fx.capture import trace_function
from kopt.passes.fuse.attention import FuseAttention
from kopt.passes.manager import run_passes
from kopt.passes.pipeline import added_by_name, default_pipeline, with_pass
from tests.conftest import rel_err

aten = torch.ops.aten
FUSED = torch.ops.kopt.capped_attention.default
NEG = float("-inf")


def _repeat_kv(x, groups):
    """transformers' repeat_kv: (B, H_kv, S, D) → (B, H_kv · groups, S, D)."""
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def _gemma(q, k, v, mask):
    """Gemma 2's eager attention: repeat_kv, scaled product, soft-cap, mask, float32 softmax."""
    k, v = _repeat_kv(k, 2), _repeat_kv(v, 2)
    s = torch.matmul(q, k.transpose(2, 3)) * 0.25
    s = torch.tanh(s / 50.0) * 50.0
    s = s + mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v).transpose(1, 2).contiguous()


def _respelled(q, k, v, mask):
    """The same soft-capped attention spelled differently: the scale folded into the tanh's argument."""
    s = q @ k.transpose(-1, -2)
    s = 50.0 * torch.tanh(s * (0.25 / 50.0)) + mask
    return torch.softmax(s, dim=-1) @ v


def _plain(q, k, v, mask):
    return torch.softmax(q @ k.transpose(-1, -2) / 4.0 + mask, dim=-1) @ v


def _inputs(dtype=torch.float32, seed=0, kv_heads=2, s_q=37, s_k=37):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, s_q, 16, generator=g) * 3
    k = torch.randn(1, kv_heads, s_k, 16, generator=g)
    v = torch.randn(1, kv_heads, s_k, 16, generator=g)
    causal = torch.where(torch.arange(s_k)[None, :] <= torch.arange(s_q)[:, None] + (s_k - s_q), 0.0, NEG)
    return [t.to(dtype) for t in (q, k, v)] + [causal[None, None].to(dtype)]


def _fused_nodes(graph_module):
    return [n for n in graph_module.graph.nodes if n.target is FUSED]


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma2s_attention_fuses_reading_keys_unrepeated_and_matches_float64(dtype):
    graph_module = trace_function(_gemma, *_inputs(dtype))
    record = run_passes(graph_module, [FuseAttention()], strict=True)[0]
    assert record.matches == {"spelled-attention": 1}
    (fused,) = _fused_nodes(graph_module)
    _, k, v, _, scale, softcap = fused.args
    assert k.meta["val"].shape[1] == v.meta["val"].shape[1] == 2  # the key/value heads, not repeated
    assert scale == pytest.approx(0.25) and softcap == pytest.approx(50.0)
    ops = [n.target for n in graph_module.graph.nodes]
    assert aten.bmm.default not in ops and aten.tanh.default not in ops and aten._softmax.default not in ops
    fresh = _inputs(dtype, seed=1)
    exact = _gemma(*[t.double() for t in fresh])
    got = _first(graph_module(*fresh))
    eager = _gemma(*fresh)
    assert 0 < rel_err(got, exact) <= max(rel_err(eager, exact), 1e-6)


def test_another_spelling_of_the_cap_and_plain_attention_fuse_to_the_same_op():
    for fn, softcap in ((_respelled, 50.0), (_plain, None)):
        args = _inputs(kv_heads=4)
        graph_module = trace_function(fn, *args)
        assert run_passes(graph_module, [FuseAttention()], strict=True)[0].matches == {"spelled-attention": 1}
        (fused,) = _fused_nodes(graph_module)
        assert fused.args[4] == pytest.approx(0.25)
        assert fused.args[5] == (None if softcap is None else pytest.approx(softcap))
        fresh = _inputs(kv_heads=4, seed=2)
        assert rel_err(_first(graph_module(*fresh)), fn(*[t.double() for t in fresh])) < 1e-6


def test_a_product_read_as_three_dims_keeps_its_shape_with_two_batches():
    def batched(q, k, v, mask):
        b, h, s, d = q.shape
        logits = torch.bmm(q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2)).view(b, h, s, s)
        p = torch.softmax(logits * 0.25 + mask, dim=-1)
        return torch.bmm(p.view(b * h, s, s), v.reshape(b * h, s, d))  # (B·H, S, D): never viewed back

    args = [torch.cat([t, t.flip(-1)]) for t in _inputs(kv_heads=4)]  # two batches, each its own values
    graph_module = trace_function(batched, *args)
    assert run_passes(graph_module, [FuseAttention()], strict=True)[0].matches == {"spelled-attention": 1}
    fresh = [torch.cat([t, t.flip(-1)]) for t in _inputs(kv_heads=4, seed=5)]
    got = _first(graph_module(*fresh))
    assert got.shape == (8, 37, 16)
    assert rel_err(got, batched(*[t.double() for t in fresh])) < 1e-6


def test_attentions_it_cannot_fuse_are_left_alone_with_their_reason():
    def probabilities_returned(q, k, v, mask):
        p = torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1)
        return p @ v, p

    def logits_read_twice(q, k, v, mask):
        s = q @ k.transpose(-1, -2) * 0.25
        return torch.softmax(s + mask, dim=-1) @ v, s.amax()

    def over_queries(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-2) @ v

    def scaled_after_mask(q, k, v, mask):
        return torch.softmax((q @ k.transpose(-1, -2) + mask) * 0.5, dim=-1) @ v

    def negative_cap(q, k, v, mask):
        return torch.softmax(-2.0 * torch.tanh(q @ k.transpose(-1, -2)) + mask, dim=-1) @ v

    cases = {probabilities_returned: "probabilities are read elsewhere", logits_read_twice: "read elsewhere",
             over_queries: "last dim", scaled_after_mask: "after the mask", negative_cap: "not positive"}
    for fn, reason in cases.items():
        graph_module = trace_function(fn, *_inputs(kv_heads=4))
        record = run_passes(graph_module, [FuseAttention()], strict=True)[0]
        assert record.matches == {} and not _fused_nodes(graph_module), fn.__name__
        assert any(reason in str(miss) for miss in record.near_misses), (fn.__name__, record.near_misses)


def test_it_is_an_opt_in_the_agent_can_add():
    assert "fuse-attention" not in [p.name for p in default_pipeline()]
    assert "fuse-attention" in added_by_name()
    auto = tuple(p.name for p in default_pipeline())
    passes = with_pass(auto, "fuse-attention")
    assert passes.index("fuse-attention") == passes.index("sibling-merge") - 1  # before codegen-fuse can take its steps
    both = with_pass(with_pass(auto, "codegen-fuse"), "fuse-attention")
    assert both.index("fuse-attention") < both.index("codegen-fuse")


def _gemma2_tiny(dtype):
    import transformers

    from kopt.workloads.llm import FAMILIES

    family = next(f for f in FAMILIES if f.name == "gemma2")
    config = transformers.Gemma2Config(**{**family.full, **family.tiny, "num_attention_heads": 4,
                                          "num_key_value_heads": 2})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiny_gemma2_fuses_once_per_block_graph_and_stays_as_close_to_float64_as_eager(dtype):
    from benchmarks.dit.zoo import BOUND_FACTOR, FLOOR

    model = _gemma2_tiny(dtype)
    reference_model = copy.deepcopy(model).double()
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(3))
    kwargs = dict(attention_mask=torch.ones(1, 16, dtype=torch.int64), use_cache=False, return_dict=False)
    passes = list(with_pass(tuple(p.name for p in default_pipeline()), "fuse-attention"))
    with torch.no_grad():
        exact = reference_model(input_ids=ids, **kwargs)[0]
        eager = model(input_ids=ids, **kwargs)[0]
        compiled = kopt.compile(model, passes=passes, lower="eager", regional=True, progress=False)
        got = compiled(input_ids=ids, **kwargs)[0]
    assert compiled.kopt_report.matches("fuse-attention") == 1  # both layers (sliding, global) share one graph
    floor = FLOOR["fp32" if dtype is torch.float32 else "bf16"]
    assert 0 < rel_err(got, exact) <= BOUND_FACTOR * rel_err(eager, exact) + floor


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gemma2_layers_at_full_head_width_lower_with_the_kernel_on_the_gpu():
    """Two Gemma 2 layers with Gemma-2-9B's heads (16 / 8, head dim 256) over 300 tokens, lowered by
    Inductor with the fused kernel, as close to the float32 model as eager bf16 is."""
    import transformers

    from benchmarks.dit.zoo import BOUND_FACTOR, FLOOR
    from kopt.workloads.llm import FAMILIES

    family = next(f for f in FAMILIES if f.name == "gemma2")
    config = transformers.Gemma2Config(**{**family.full, "num_hidden_layers": 2, "vocab_size": 1024,
                                          "hidden_size": 1024, "intermediate_size": 2048, "sliding_window": 128})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).cuda().eval()
    reference_model = copy.deepcopy(model)
    model = model.bfloat16()
    ids = torch.randint(0, 1024, (1, 300), generator=torch.Generator().manual_seed(4)).cuda()
    kwargs = dict(attention_mask=torch.ones(1, 300, dtype=torch.int64, device="cuda"), use_cache=False,
                  return_dict=False)
    passes = list(with_pass(tuple(p.name for p in default_pipeline()), "fuse-attention"))
    with torch.no_grad():
        exact = reference_model(input_ids=ids, **kwargs)[0]
        eager = model(input_ids=ids, **kwargs)[0]
        compiled = kopt.compile(model, passes=passes, regional=True, progress=False)
        got = compiled(input_ids=ids, **kwargs)[0]
    assert compiled.kopt_report.matches("fuse-attention") == 1
    assert rel_err(got, exact) <= BOUND_FACTOR * rel_err(eager, exact) + FLOOR["bf16"]


def test_the_agent_accepts_fuse_attention_on_tiny_gemma2_and_kopt_compile_applies_it(tmp_path):
    """The user's path on the cost model: ``optimize`` proposes ``add fuse-attention`` for Gemma 2's block
    graph and keeps it; ``kopt.compile(passes="auto", regional=True, kb=...)`` then finds that choice
    by the block graph's signature, re-verifies it and fuses the attention; the output stays as close to
    float64 as eager's."""
    from benchmarks.dit.zoo import BOUND_FACTOR, FLOOR
    from kopt.agent.candidate import CandidateKind
    from kopt.agent.kb import Status
    from kopt.agent.loop import optimize

    model = _gemma2_tiny(torch.float32)
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(5))
    kwargs = dict(attention_mask=torch.ones(1, 16, dtype=torch.int64), use_cache=False, return_dict=False)
    kb_path = tmp_path / "kb.sqlite"
    result = optimize(model, dict(input_ids=ids, **kwargs), budget_min=3, kb_path=kb_path, regional=True,
                      clock="cost-model", progress=False, workers=1)
    accepted = [e.candidate for e in result.evaluations
                if e.status is Status.ACCEPTED and e.candidate.kind is CandidateKind.PASS_CHOICE]
    assert any(dict(c.params).get("change") == "add fuse-attention" for c in accepted), [c.params for c in accepted]
    reference_model = copy.deepcopy(model).double()
    compiled = kopt.compile(model, passes="auto", regional=True, lower="eager", kb=kb_path, check_lowering=False,
                            progress=False)
    with torch.no_grad():
        got = compiled(input_ids=ids, **kwargs)[0]
        exact = reference_model(input_ids=ids, **kwargs)[0]
        eager = model(input_ids=ids, **kwargs)[0]
    records = {p.name: p for g in compiled.kopt_report.graphs for p in g.passes}
    assert any("KB pipeline choice re-verified" in n for n in records["kb-pipeline"].notes)
    assert compiled.kopt_report.matches("fuse-attention") == 1
    assert rel_err(got, exact) <= BOUND_FACTOR * rel_err(eager, exact) + FLOOR["fp32"]
