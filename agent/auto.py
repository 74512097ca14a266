"""``passes="auto"`` with the knowledge base: apply what was proven for these regions on this machine.

:func:`with_knowledge_base` is the one hook ``kopt.compile`` calls: when the pass list includes
``"auto"`` and a knowledge base file exists, it inserts :class:`KnowledgeBasePass` right before
``staging`` — the point where the agent's loop found and measured its regions
(:func:`kopt.agent.graphs.passes_before_staging`), so the same regions are there to replace.

Rules, and why: a candidate applies only where its region's signature matches (same computation,
shapes, dtypes, strides) and only if it was accepted in this environment (same GPU, driver, torch,
triton, kopt: its numbers were measured here); on first use in a process it is verified again in the
sandbox (the verifier or the environment's libraries may have changed since), and a candidate that
fails is not applied: the report's near misses say why, and the KB gets a re-evaluation record
(status ``rejected``, superseding the accepted one) so later runs do not try it again. Pipeline
choices (another pass list for one graph signature) apply the same way, through :mod:`kopt.agent.auto_pipeline`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from kopt.passes.base import Contract, Pass, PassContext

RULE = "kb-candidate"
_VERIFIED: dict[str, str | None] = {}  # content hash -> None (passed) or the reason it failed, per process
_LOCK = threading.Lock()


def knowledge_base_path(kb: str | Path | bool | None) -> Path | None:
    """The KB file ``kopt.compile(kb=...)`` means, or None: False disables, None means ``$KOPT_KB`` or
    the default file, each only if it exists (a compile never creates a knowledge base)."""
    if kb is False:
        return None
    if kb is None or kb is True:
        from kopt.agent.kb.store import default_path

        kb = os.environ.get("KOPT_KB") or default_path()
    path = Path(kb)
    return path if path.is_file() else None


def uses_auto(spec: object) -> bool:
    """Whether a ``passes=`` spec includes ``"auto"``."""
    return spec == "auto" or (isinstance(spec, (list, tuple)) and "auto" in spec)


def with_knowledge_base(passes: object, kb: str | Path | bool | None = None, *, auto: bool | None = None) -> object:
    """``passes`` with a :class:`KnowledgeBasePass` before ``staging``, when it uses ``"auto"`` (or
    ``auto``: the spec the caller started from did, before options expanded it) and the knowledge
    base exists; otherwise ``passes`` unchanged."""
    path = knowledge_base_path(kb)
    if path is None or not (uses_auto(passes) if auto is None else auto):
        return passes
    from kopt.agent.auto_pipeline import accepted_choices, switched
    from kopt.passes.pipeline import resolve

    resolved = resolve(passes)
    choices = accepted_choices(path, [p.name for p in resolved])
    if choices:  # pipeline choices for some graphs (kopt.agent.auto_pipeline)
        resolved = switched(resolved, choices, path)
    names = [p.name for p in resolved]
    at = names.index("staging") if "staging" in names else len(resolved)
    return [*resolved[:at], KnowledgeBasePass(path), *resolved[at:]]


def _reverify(kb: object, region: object, candidate: object, record: object) -> str | None:
    """None if ``candidate`` passes the verifier again (once per process), else the reason."""
    from kopt.agent.kb import Status
    from kopt.agent.verify import VerifyConfig, verify

    with _LOCK:
        if candidate.content_hash in _VERIFIED:
            return _VERIFIED[candidate.content_hash]
    verdict = verify(region, candidate, VerifyConfig())
    reason = None if verdict.accepted else verdict.reason
    if reason is not None:
        kb.record_candidate(candidate, status=Status.REJECTED, reason=f"re-verification on first use: {reason}",
                            verdict=verdict, supersedes=record)
    with _LOCK:
        _VERIFIED[candidate.content_hash] = reason
    return reason


class KnowledgeBasePass(Pass):
    """Replace regions by the candidates the knowledge base accepted for them in this environment."""

    name = "kb-apply"
    why = ("a candidate the agent accepted computes what its region computes within its contract "
           "(verified again on first use) and made the whole model faster on this machine")
    contract = Contract.tolerance(1e-2)

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def apply(self, graph_module: torch.fx.GraphModule, ctx: PassContext) -> None:
        from kopt.agent.apply import apply_candidates
        from kopt.agent.candidate import Candidate
        from kopt.agent.kb import KnowledgeBase, current_environment
        from kopt.agent.profile import find_occurrences

        occurrences = find_occurrences(graph_module)
        if not occurrences:
            return
        chosen = {}
        with KnowledgeBase(self.path) as kb:
            environment = current_environment()
            for occurrence in occurrences:
                signature = occurrence.region.signature
                if signature in chosen:
                    continue
                for record in kb.accepted(signature, environment):
                    candidate = Candidate.from_dict(record.candidate)
                    reason = _reverify(kb, occurrence.region, candidate, record)
                    if reason is None:
                        chosen[signature] = candidate
                        ctx.notes.append(f"region {signature[:12]}: KB candidate {candidate.content_hash[:12]} "
                                         f"re-verified ({record.reason[:80]})")
                        break
                    ctx.decline(RULE, occurrence.region.output_nodes[-1],
                                f"KB candidate {candidate.content_hash[:12]} failed re-verification: {reason}")
        if chosen:
            count = apply_candidates(graph_module, chosen, ctx)
            ctx.notes.append(f"{count} region occurrence(s) replaced by knowledge-base candidates ({self.path})")
