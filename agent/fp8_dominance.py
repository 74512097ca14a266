"""FP8 choices settled, untimed, by one that rounds less and already missed the model's output contract.

The FP8 choices of :func:`kopt.agent.propose.pipeline.fp8_choices` come in pairs: a granularity, and
the same granularity with FP8 attention (Q, K and V quantized, the attention output quantized for the
next GEMM). The second rounds everything the first rounds, on the same graph with the same FP8
config, and more. On Gemma 2 (s26) every FP8 choice missed the quality gate on the model's output the
same way, and each paid its compile, checks and A/B (75-100 s of a 9-minute budget).

The rule: a pipeline choice that equals another one evaluated on the same graph (same base, kept
chain, attention backends and lowering) except that it adds only FP8 rounding passes and turns the
FP8 config's ``attention`` on, is settled as rejected without being compiled or timed once that other
choice's model output was outside the contract. Why it is sound enough to skip an A/B: the added
roundings are independent of the first ones (other tensors, other scales), and independent errors add
in variance rather than cancel, so the model's output moves further from the reference on average; a
rare cancellation is not worth a minute of the budget. The record says it was not timed and which
evaluation settled it, so the verdict can be read for what it is. The loop also tries the lesser
choice first (:func:`lesser_rounding_first`), so that the rule can apply.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kopt.agent.candidate import Candidate, CandidateKind

# passes whose only effect is more FP8 rounding of tensors the lesser choice keeps in bf16
ROUNDING_PASSES = frozenset({"fp8-attention", "fuse-attention-output-quant"})


def _choice(source: str) -> Mapping[str, Any] | None:
    try:
        data = json.loads(source)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, Mapping) and "passes" in data else None


def fp8_linear_options(choice: Mapping[str, Any]) -> dict | None:
    """The decoded options a pipeline choice (its JSON, decoded) gives ``fp8-linear``: ``{"fp8": config
    fields, ...}``, or None when it runs no FP8 linears."""
    for name, encoded in choice.get("options", ()):
        if name == "fp8-linear":
            return json.loads(encoded)
    return None


def pipeline_choice_of(candidate: Candidate) -> Mapping[str, Any] | None:
    """``candidate``'s pipeline choice, decoded, or None when it is not one."""
    return _choice(candidate.source) if candidate.kind is CandidateKind.PASS_CHOICE else None


def _fp8_config(choice: Mapping[str, Any]) -> dict | None:
    options = fp8_linear_options(choice)
    return options.get("fp8") if options is not None else None


def _is_subsequence(short: Sequence[str], long: Sequence[str]) -> bool:
    remaining = iter(long)
    return all(name in remaining for name in short)


def adds_rounding(candidate: Candidate, lesser: Candidate) -> bool:
    """Whether ``candidate`` is ``lesser`` with FP8 attention added and nothing else changed (module
    docstring): the same graph, base, kept chain, attention backends, lowering and FP8 config but
    ``attention``, and extra passes that only round."""
    if CandidateKind.PASS_CHOICE not in (candidate.kind, lesser.kind) or candidate.kind is not lesser.kind:
        return False
    if candidate.region_signature != lesser.region_signature:
        return False
    mine, other = _choice(candidate.source), _choice(lesser.source)
    if mine is None or other is None:
        return False
    same = ("base", "sdpa", "on_top_of", "inductor")
    if any(mine.get(key) != other.get(key) for key in same):
        return False
    passes, fewer = list(mine["passes"]), list(other["passes"])
    extra = [p for p in passes if p not in fewer]
    if not extra or not set(extra) <= ROUNDING_PASSES or not _is_subsequence(fewer, passes):
        return False
    config, lesser_config = _fp8_config(mine), _fp8_config(other)
    if config is None or lesser_config is None:
        return False
    return (config.get("attention") is True and lesser_config.get("attention") is False
            and {**config, "attention": False} == lesser_config)


def missed_model_contract(verification: Mapping[str, Any] | None) -> bool:
    """Whether a pipeline choice's whole-model check found the model's output outside the contract."""
    if not isinstance(verification, Mapping) or verification.get("kind") != "whole-model":
        return False
    return any(check.get("graph") == "model" and not check.get("ok") for check in verification.get("checks", ()))


def settled_by(candidate: Candidate, records: Iterable[Any]) -> Any | None:
    """The knowledge-base record (of ``records``: this graph's evaluations in this environment) of a
    choice ``candidate`` only adds rounding to and whose model output missed the contract, or None."""
    if candidate.kind is not CandidateKind.PASS_CHOICE:
        return None
    for record in records:
        if not missed_model_contract(record.verification):
            continue
        if adds_rounding(candidate, Candidate.from_dict(record.candidate)):
            return record
    return None


def settled_reason(candidate: Candidate, record: Any) -> str:
    """The evaluation's reason: what settled it, and that it was not timed."""
    lesser = dict(Candidate.from_dict(record.candidate).params).get("change", record.candidate_hash[:12])
    return (f"not timed: it only adds FP8 attention to {lesser!r}, whose model output was already outside the "
            f"contract ({record.reason[:160]}); more rounding on the same graph is not expected to bring it back")


def lesser_rounding_first(candidates: Sequence[Candidate]) -> list[Candidate]:
    """``candidates`` in their order, but each choice that adds rounding to another one of the list
    (:func:`adds_rounding`) right after that one, so that its verdict can settle it."""
    choices = [c for c in candidates if c.kind is CandidateKind.PASS_CHOICE and _choice(c.source) is not None]
    lesser_of = {c.content_hash: next((o for o in choices if o is not c and adds_rounding(c, o)), None)
                 for c in choices}
    placed: set[str] = set()
    waiting: dict[str, list[Candidate]] = {}
    ordered: list[Candidate] = []

    def place(candidate: Candidate) -> None:
        ordered.append(candidate)
        placed.add(candidate.content_hash)
        for follower in waiting.pop(candidate.content_hash, []):
            place(follower)

    for candidate in candidates:
        lesser = lesser_of.get(candidate.content_hash)
        if lesser is not None and lesser.content_hash not in placed:
            waiting.setdefault(lesser.content_hash, []).append(candidate)
        else:
            place(candidate)
    for followers in waiting.values():  # a lesser one not in the list after all: keep them, in order
        ordered.extend(f for f in followers if f.content_hash not in placed)
    return ordered
