"""The LLM proposer: Claude writes a replacement for a region, through the anthropic SDK's Messages API.

The model sees the region's canonical FX text and ATen source, its input/output shapes, its profile
(time, occurrences, floor and what bounds it) and the knowledge base's lessons for its region class,
and answers by calling the tool ``propose_candidate`` (source, entry point, why, contract). What it
returns is untrusted code: it becomes a :class:`~kopt.agent.candidate.Candidate` and goes through
the same sandboxed verifier and end-to-end benchmark as any other.

Every exchange (request and response, verbatim) is written as one JSON file
(:data:`FORMAT`) to the recording folder; **replay** mode reads such files instead of calling the
API, matching them to regions by class key (the same computation at any size), so tests and
machines without network run the same path from the response onward. Modes
(:meth:`LLMProposer.from_environment`): ``KOPT_LLM_REPLAY=<folder>`` replays; else
``ANTHROPIC_API_KEY`` calls the API (recording to ``KOPT_LLM_RECORD`` or ``~/.cache/kopt/llm``);
else the proposer yields nothing and says so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kopt.agent.candidate import Candidate, CandidateKind, Convention
from kopt.passes.base import Contract

log = logging.getLogger("kopt")
FORMAT = "kopt-llm-exchange/1"
DEFAULT_MODEL = "claude-sonnet-4-5"
TOOL = {
    "name": "propose_candidate",
    "description": "Propose a replacement for the region: Python source defining the entry point, which takes the "
                   "region's inputs in order (in0, in1, ...) and returns its outputs as a tuple. Only torch, triton "
                   "and math may be imported; the code runs in a sandbox without files or network.",
    "input_schema": {
        "type": "object",
        "properties": {
            "source": {"type": "string", "description": "complete Python module source"},
            "entry_point": {"type": "string", "description": "name of the function to call"},
            "why": {"type": "string", "description": "one sentence: why it computes what the region computes"},
            "kind": {"type": "string", "enum": ["triton-kernel", "rule-by-example"]},
            "convention": {"type": "string", "enum": ["returns", "out"]},
            "rel_tol": {"type": "number", "description": "relative error budget claimed (tolerance contract)"},
        },
        "required": ["source", "entry_point", "why", "kind", "rel_tol"],
    },
}
SYSTEM = ("You optimize one region of a PyTorch inference graph (functional ATen ops). Write a faster "
          "replacement that computes the same values within the stated tolerance for any input values, "
          "including NaN and inf, at the given shapes. Answer only by calling propose_candidate.")


def build_prompt(occurrence: Any, region_profile: Any, lessons: Sequence[Any]) -> str:
    """What the model sees about one region."""
    region = occurrence.region
    lines = ["Region (canonical ATen source):", region.source, "Canonical FX text:", region.text.exact,
             "Inputs: " + "; ".join(f"in{i}: {tuple(s.shape)} {s.dtype} stride {tuple(s.stride)} ({s.role.value})"
                                    for i, s in enumerate(region.inputs)),
             "Outputs: " + "; ".join(f"{tuple(s.shape)} {s.dtype}" for s in region.outputs)]
    if region_profile is not None:
        floor = region_profile.floor
        lines.append(f"Profile: {region_profile.occurrences} occurrence(s) per call, "
                     f"{region_profile.seconds_each * 1e6:.1f} us each; floor {floor.seconds * 1e6:.2f} us "
                     f"({floor.bound}-bound: {floor.bytes:.0f} bytes, {floor.flops:.0f} FLOPs)")
    if lessons:
        lines.append("Lessons from earlier attempts on this region class:")
        lines += [f"- [{lesson.outcome.value}] {lesson.text}" for lesson in lessons[-8:]]
    return "\n".join(lines)


def candidate_from_response(response: dict, region: Any, origin: str) -> Candidate | None:
    """The candidate a response's ``propose_candidate`` tool call describes (None if it has none)."""
    for block in response.get("content", []):
        if block.get("type") == "tool_use" and block.get("name") == TOOL["name"]:
            data = block["input"]
            return Candidate(region.signature, CandidateKind(data.get("kind", "triton-kernel")), data["source"],
                             Contract.tolerance(float(data.get("rel_tol", 1e-2))), entry_point=data["entry_point"],
                             convention=Convention(data.get("convention", "returns")), why=data.get("why", ""),
                             origin=origin, params=(("proposer", "llm"), ("model", response.get("model", ""))))
    return None


@dataclasses.dataclass
class LLMProposer:
    """Live (``client``: an ``anthropic.Anthropic``) or replay (``replay``: a folder of recordings)."""

    client: Any = None
    replay: Path | None = None
    record: Path | None = None
    model: str = DEFAULT_MODEL
    top_regions: int = 3
    max_tokens: int = 4096

    @staticmethod
    def from_environment() -> LLMProposer:
        if os.environ.get("KOPT_LLM_REPLAY"):
            return LLMProposer(replay=Path(os.environ["KOPT_LLM_REPLAY"]))
        record = Path(os.environ.get("KOPT_LLM_RECORD") or Path.home() / ".cache" / "kopt" / "llm")
        if os.environ.get("ANTHROPIC_API_KEY"):
            import anthropic

            return LLMProposer(client=anthropic.Anthropic(), record=record)
        return LLMProposer(record=record)

    def request(self, prompt: str) -> dict:
        return {"model": self.model, "max_tokens": self.max_tokens, "system": SYSTEM, "tools": [TOOL],
                "tool_choice": {"type": "tool", "name": TOOL["name"]},
                "messages": [{"role": "user", "content": prompt}]}

    def _recorded(self, class_key: str) -> list[dict]:
        files = sorted(self.replay.glob("*.json")) if self.replay.is_dir() else [self.replay]
        found = []
        for path in files:
            data = json.loads(path.read_text())
            if data.get("format") == FORMAT and data.get("class_key") == class_key:
                found.append(data)
        return found

    def exchange(self, occurrence: Any, region_profile: Any, lessons: Sequence[Any]) -> list[dict]:
        """The exchanges for one region: replayed, or one live call (recorded)."""
        region = occurrence.region
        if self.replay is not None:
            return self._recorded(region.class_key)
        if self.client is None:
            log.info("agent: llm proposer: no ANTHROPIC_API_KEY and no KOPT_LLM_REPLAY; no proposals")
            return []
        request = self.request(build_prompt(occurrence, region_profile, lessons))
        response = self.client.messages.create(**request).model_dump(mode="json")
        exchange = {"format": FORMAT, "provenance": "recorded from the Anthropic Messages API by kopt",
                    "recorded_at": time.time(), "region_signature": region.signature, "class_key": region.class_key,
                    "request": request, "response": response}
        if self.record is not None:
            self.record.mkdir(parents=True, exist_ok=True)
            (self.record / f"{region.class_key[:16]}-{int(time.time() * 1000)}.json").write_text(
                json.dumps(exchange, indent=1))
        return [exchange]

    def propose_batches(self, occurrences: Sequence[Any], profile: Any, kb: Any) -> Iterator[list[Candidate]]:
        """One exchange per region for the ``top_regions`` best-ranked regions, a batch per region: a
        region's prompt reads the KB's lessons only when the batch is asked for."""
        first = {}
        for occurrence in occurrences:
            first.setdefault(occurrence.region.signature, occurrence)
        for region_profile in list(profile.regions)[:self.top_regions]:
            occurrence = first.get(region_profile.region.signature)
            if occurrence is None:
                continue
            lessons = kb.lessons(occurrence.region.class_key) if kb is not None else []
            batch = []
            for exchange in self.exchange(occurrence, region_profile, lessons):
                origin = "llm:" + exchange["response"].get("model", self.model)
                candidate = candidate_from_response(exchange["response"], occurrence.region, origin)
                if candidate is not None:
                    batch.append(candidate)
            yield batch

    def propose_all(self, occurrences: Sequence[Any], profile: Any, kb: Any) -> Iterator[Candidate]:
        """One exchange per region for the ``top_regions`` best-ranked regions."""
        for batch in self.propose_batches(occurrences, profile, kb):
            yield from batch