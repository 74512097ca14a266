"""Run a tiny random Llama in vLLM (in this process) and print what it generated as JSON.

``python vllm_generate.py MODEL_DIR plain|kopt|failing``: ``kopt`` names kopt's pass in the compilation
config as a user would; ``failing`` passes a kopt pass whose only rewrite raises (kopt must catch it and
vLLM must run plain). Run by tests/integrations/test_vllm.py in vLLM's own venv.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its pass is readable

PROMPTS = ["hello world", "the quick brown fox jumps"]


def main(model_dir: str, mode: str) -> None:
    from vllm import LLM, SamplingParams

    import kopt
    from kopt.integrations.inductor_pass import KoptPostGradPass
    from kopt.integrations.vllm import KoptVllmPass, compilation_config
    from kopt.passes.base import Contract, FunctionPass

    config: dict = {}
    kopt_pass = kopt.kopt_post_grad_pass
    if mode == "kopt":
        config = compilation_config()
    elif mode == "failing":
        def explode(graph_module, ctx):  # stands for any bug in a kopt rewrite, after it changed the graph
            graph_module.graph.erase_node(next(n for n in graph_module.graph.nodes if n.op == "output"))
            raise RuntimeError("a bug in a kopt rewrite")

        broken = FunctionPass("explode", "raises mid-rewrite", Contract.exact(), explode)
        kopt_pass = kopt.kopt_post_grad_pass = KoptVllmPass(KoptPostGradPass([broken, "redundancy"]))
        config = compilation_config()  # by name, as a user names it: vLLM resolves it to the broken pass
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, compilation_config=config, seed=0,
              max_num_seqs=4, gpu_memory_utilization=0.05, kv_cache_memory_bytes=32 << 20)
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16))
    graphs = kopt_pass.report.graphs
    print("RESULT " + json.dumps(dict(
        tokens=[o.outputs[0].token_ids for o in outputs],
        graphs=len(graphs),
        nodes=[sum(r.after.values()) for g in graphs for r in g.passes[-1:]],
        rewrites=kopt_pass.rewrites(),
        statuses=[r.status for g in graphs for r in g.passes],
        fallbacks=[g.fallback for g in graphs],
        why_not=kopt_pass.why_not(),
        disabled=kopt_pass.disabled,
    )))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
