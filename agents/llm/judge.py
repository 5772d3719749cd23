"""The LLM judge and the factory that builds a judge from a scenario's ``judge`` spec.

:class:`LLMJudge` asks any chat backend (an OpenAI-compatible model, given to it as a
:class:`~agents.llm.backends.base.Backend`) to score the rubric of :mod:`market.core.judge` as
JSON, validated by pydantic, with retries; on failure it falls back to the rule verdict (recorded
as ``kind="llm-fallback"``). Its validated answers are kept by sha256 of (model, rubric version,
input), in memory and, given a ``cache_path``, in the project's one LLM response cache
(:class:`~agents.llm.cache.ResponseCache`). The rule audit stays binding: a pitch the rule judge
scores 0 (a false claim, a text gate, no runnable need) is decided without asking the model
(``kind="llm-audit"``), so injected text never reaches it.

Trust boundary: the pitch reaches the model only as a quoted ``[untrusted pitch from SEAT ...]``
block (:func:`market.environment.quote_untrusted`) and the system prompt states
:data:`~market.environment.UNTRUSTED_RULE`. Safety does not rest on the model obeying it: the
verdict is bound by the rule audit (:func:`market.core.judge.bound_llm_scores`): the fact
dimensions are the audit's and the model may only lower honesty and text quality, each by at most
``LLM_BAND`` of the audit's value, so ``(1 - LLM_BAND)^2 x R <= total <= R`` with ``R`` the rule
total, and no wording lifts a pitch above an honest pitch with the same verified facts. The
keyword injection detector (:mod:`market.core.claims`) stays a signal (a gated pitch scores 0 and
is never sent), not the defence.

The request's JSON schema (:data:`JUDGE_SCHEMA`) is small and has no length bounds: servers that
compile a schema to a grammar (llama.cpp) choke on large ``maxLength``/``maxItems``. A failed call
is logged with the backend's own message, and that message is kept in the fallback verdict's
rationale (so it reaches the transcript).

:func:`make_judge` builds a judge from a spec: ``"rule"`` (:class:`market.core.judge.RuleJudge`)
or ``"llm:openai?model=NAME&base_url=URL"``. Recorded verdicts replay from the transcript
(``market.review.replay``), never from this cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.llm.backends.base import Backend, Completion
from agents.llm.backends.registry import backend_class
from agents.llm.cache import ResponseCache
from market.core.claims import Claim, JudgeContext
from market.core.judge import (
    DIMENSIONS,
    LLM_BAND,
    RATIONALE_CHARS,
    RUBRIC_TEXT,
    RUBRIC_VERSION,
    RuleJudge,
    Verdict,
    bound_llm_scores,
    clip_rationale,
    combine,
)
from market.core.negotiation import Pitch
from market.core.scenario_schema import JUDGE_KINDS
from market.core.summation import ordered_sum
from market.core.trust import UNTRUSTED_RULE, quote_untrusted
from market.core.world import Lab

logger = logging.getLogger(__name__)
JUDGE_SYSTEM_PROMPT = f"{RUBRIC_TEXT}\n{UNTRUSTED_RULE}"
ERROR_CHARS = 300  # a backend's error message is kept this long


class LLMScores(BaseModel):
    """The JSON an LLM judge must return: one score per rubric dimension and a short rationale."""

    model_config = ConfigDict(extra="ignore")

    true_need: float = Field(ge=0.0, le=1.0)
    honesty: float = Field(ge=0.0, le=1.0)
    conduct: float = Field(ge=0.0, le=1.0)
    fairness: float = Field(ge=0.0, le=1.0)
    text_quality: float = Field(ge=0.0, le=1.0)
    rationale: str = ""


# The schema sent with every request: five numbers in [0, 1] and a string, no length bounds (a
# server that compiles it to a grammar must get a small one; rationales are clipped afterwards).
JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        **{d: {"type": "number", "minimum": 0, "maximum": 1} for d in DIMENSIONS},
        "rationale": {"type": "string"},
    },
    "required": [*DIMENSIONS, "rationale"],
}


def error_text(exc: BaseException) -> str:
    """``Type: message`` of an exception, on one line, cut to :data:`ERROR_CHARS`."""
    message = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def clamp_scores(data: dict[str, Any]) -> bool:
    """In place: rubric scores that are finite numbers outside [0, 1] moved into it; True if any.

    A schema's ``minimum``/``maximum`` on a number is not enforced by every server's grammar
    (llama.cpp's is not), and small models answer ``"conduct": 2``. The bound of the rule audit
    clamps judgement scores again and ignores the fact scores, so this repair cannot lift a pitch;
    it is counted in ``LLMJudge.clamped``.
    """
    changed = False
    for d in DIMENSIONS:
        value = data.get(d)
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and not 0.0 <= value <= 1.0
        ):
            data[d] = min(1.0, max(0.0, float(value)))
            changed = True
    return changed


def _json_object(text: str) -> str:
    """The outermost ``{...}`` of a reply (models wrap JSON in prose or code fences)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object in the reply")
    return text[start : end + 1]


class LLMJudge:
    """The rubric scored by a chat model (``backend.complete(messages, schema, params)``).

    The prompt holds the rubric, the pitch (as untrusted data), the pitching lab's own true facts
    (its live jobs, reputation and record, so the model can check the claims) and public context
    only. The reply is validated by :class:`LLMScores`; a failed call or invalid reply is retried
    ``retries`` times, then the rule verdict is used (``kind="llm-fallback"``). Valid replies are
    cached by sha256 of (model, rubric version, prompt), in memory and in ``cache_path`` (SQLite)
    when given, so a second identical pitch never calls the backend.
    """

    kind = "llm"
    version = RUBRIC_VERSION

    def __init__(
        self,
        backend: Backend,
        cache_path: str | Path | None = None,
        retries: int = 2,
        params: dict[str, Any] | None = None,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.backend = backend
        self.model: str | None = str(getattr(backend, "model", "unknown"))
        self.retries = retries
        self.params = {"temperature": 0.0, "max_tokens": 300, **(params or {})}
        self.rule = RuleJudge()
        self.memory: dict[str, str] = {}  # validated scores by cache key (this process)
        self.store = None if cache_path is None else ResponseCache(cache_path)
        self.calls = 0  # backend calls made
        self.failures = 0  # verdicts that fell back to the rule judge
        self.clamped = 0  # replies whose scores lay outside [0, 1] and were clamped (repairs)

    def describe(self) -> str:
        return f"llm/{self.version}/{self.model}"

    def prompt(
        self, pitch: Pitch, lab: Lab, context: JudgeContext, claims: list[Claim]
    ) -> list[dict[str, str]]:
        """The chat messages for one pitch: only this lab's facts and public context."""
        now = context.round
        jobs = [
            {
                "job_id": j.job_id,
                "size": j.size,
                "remaining": j.remaining,
                "deadline": j.deadline,
                "rounds_left": max(1, j.deadline - now + 1),
                "value": round(j.value, 2),
                "value_per_block": round(j.unit_value, 2),
                "runnable": j.min_reliability <= context.reliability,
            }
            for j in lab.jobs
            if j.status == "active" and j.remaining > 0
        ]
        facts = {
            "round": now,
            "block_reliability": context.reliability,
            "live_jobs": jobs,
            "reputation": round(lab.reputation, 3),
            "blocks_granted_to_this_lab_before": context.past_grants.get(lab.index, 0),
            "blocks_granted_to_all_labs_before": ordered_sum(context.past_grants.values()),
            "false_claim_verdicts_before": context.past_false_claims.get(lab.index, 0),
            "labs_pitching_this_round": context.pitching,
            "automatic_claim_audit": [c.describe() for c in claims],
        }
        request = {
            "blocks_requested": pitch.blocks_requested,
            "job_id": pitch.job_id,
            **{
                k: getattr(pitch, k)
                for k in ("claimed_deadline", "claimed_blocks", "claimed_value")
                if getattr(pitch, k, None) is not None
            },
        }
        user = (
            "FACTS about the pitching lab (true, private to the committee):\n"
            + json.dumps(facts, sort_keys=True)
            + "\nREQUEST:\n"
            + json.dumps(request, sort_keys=True)
            + "\nPITCH TEXT:\n"
            + quote_untrusted(lab.seat, "pitch", pitch.text)
        )
        return [
            {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ]

    def cache_key(self, messages: list[dict[str, str]]) -> str:
        blob = json.dumps(
            {"model": self.model, "rubric": RUBRIC_VERSION, "messages": messages},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def cached_scores(self, key: str) -> str | None:
        """The validated scores recorded under ``key``: in memory, else in the response cache."""
        if key in self.memory:
            return self.memory[key]
        entry = None if self.store is None else self.store.get(key)
        if entry is None or entry.completion is None:
            return None
        self.memory[key] = entry.completion.text
        return entry.completion.text

    def remember(self, key: str, scores: str) -> None:
        """Keep validated scores under ``key`` in memory and in the response cache (if any)."""
        self.memory[key] = scores
        if self.store is not None:
            self.store.put(key, 0, Completion(text=scores, model=str(self.model)))

    def close(self) -> None:
        """Close the response cache's connection."""
        if self.store is not None:
            self.store.close()

    def _ask(self, messages: list[dict[str, str]]) -> LLMScores:
        schema = JUDGE_SCHEMA
        convo = list(messages)
        error = "no attempt"
        for _ in range(self.retries + 1):
            self.calls += 1
            try:
                reply = self.backend.complete(convo, schema, dict(self.params))
                data = json.loads(_json_object(reply.text))
                if isinstance(data, dict) and clamp_scores(data):
                    self.clamped += 1
                return LLMScores.model_validate(data)
            except (ValidationError, ValueError) as exc:
                error = f"invalid reply: {str(exc).splitlines()[0]}"
                convo = [
                    *messages,
                    {
                        "role": "user",
                        "content": "Your reply was not a valid JSON object with the five scores in "
                        "[0, 1] and a rationale. Reply with that JSON object only.",
                    },
                ]
            except Exception as exc:  # BackendError, timeouts, anything the client raises
                error = f"backend error: {error_text(exc)}"
                logger.warning("LLM judge (%s): %s", self.model, error)
        raise RuntimeError(error)

    def score(self, pitch: Pitch, lab: Lab, context: JudgeContext) -> Verdict:
        """The LLM's rubric verdict, bound by the rule audit; the rule verdict if the LLM fails.

        Bound (:func:`~market.core.judge.bound_llm_scores`): the fact dimensions are the audit's,
        honesty and text quality are the model's clamped to ``[(1 - LLM_BAND) x audit, audit]``,
        so the total lies in ``[(1 - LLM_BAND)^2 x R, R]`` (``R``: the rule total). A pitch the rule audit already scores 0 (a false claim, a text gate, no runnable need) is
        decided without asking the model (``kind="llm-audit"``): gated text such as a prompt
        injection never reaches it, and no tokens are spent on a foregone verdict.
        """
        rule_scores, claims, _, _ = self.rule.audit(pitch, lab, context)
        rule_total = combine(rule_scores)
        if rule_total == 0.0:
            audit = self.rule.score(pitch, lab, context)
            return dataclasses.replace(
                audit,
                kind="llm-audit",
                model=self.model,
                rationale=clip_rationale(
                    f"rule audit, model not asked: {audit.rationale}", 2 * RATIONALE_CHARS
                ),
            )
        messages = self.prompt(pitch, lab, context, claims)
        key = self.cache_key(messages)
        hit = self.cached_scores(key)
        parsed: LLMScores | None = None
        if hit is not None:
            try:
                parsed = LLMScores.model_validate_json(hit)
            except ValidationError:  # a corrupt or older entry: ask again
                hit = None
        try:
            if parsed is None:
                parsed = self._ask(messages)
        except RuntimeError as exc:
            self.failures += 1
            fallback = self.rule.score(pitch, lab, context)
            return dataclasses.replace(
                fallback,
                kind="llm-fallback",
                model=self.model,
                rationale=clip_rationale(
                    f"LLM judge failed ({exc}); rule verdict: {fallback.rationale}",
                    2 * RATIONALE_CHARS,
                ),
            )
        if hit is None:
            self.remember(key, parsed.model_dump_json())
        asked = {d: round(float(getattr(parsed, d)), 4) for d in DIMENSIONS}
        scores = bound_llm_scores(rule_scores, asked)
        total = combine(scores)
        bound = (
            f" [bound by the rule audit: total {total:.2f} in "
            f"[{(1 - LLM_BAND) ** 2 * rule_total:.2f}, {rule_total:.2f}]; "
            f"model's own total {combine(asked):.2f}]"
        )
        return Verdict(
            lab=lab.index,
            scores=scores,
            total=total,
            granted=0,
            rationale=clip_rationale(parsed.rationale, RATIONALE_CHARS) + bound,
            kind=self.kind,
            version=self.version,
            model=self.model,
            claims_checked=tuple(c.describe() for c in claims),
            requested=pitch.blocks_requested,
            cached=hit is not None,
        )


# --------------------------------------------------------------------------------------------
# building judges and allocating the pool
# --------------------------------------------------------------------------------------------
class JudgeSpecError(ValueError):
    """A judge spec could not be built; the message says what is accepted."""


JUDGE_SPEC_HELP = (
    "a judge spec is 'rule' or 'llm:openai?model=NAME&base_url=URL' (optional: "
    "cache=PATH, retries=N and OpenAIBackend options such as timeout)"
)


def check_judge_spec(spec: str) -> str:
    """Validate a judge spec's shape without building it (used by the scenario schema)."""
    if not isinstance(spec, str) or not spec.strip():
        raise JudgeSpecError(f"empty judge spec; {JUDGE_SPEC_HELP}")
    name = spec.strip().partition("?")[0]
    if name not in JUDGE_KINDS:
        raise JudgeSpecError(f"unknown judge {name!r}; {JUDGE_SPEC_HELP}")
    return spec.strip()


def _coerce(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def make_judge(spec: str = "rule") -> RuleJudge | LLMJudge:
    """Build a judge: ``"rule"``, or ``"llm:openai?model=...&base_url=..."``; the OpenAI-compatible
    backend is imported only for an LLM judge (:mod:`agents.llm.backends.registry`)."""
    name, _, query = check_judge_spec(spec).partition("?")
    try:
        params = {
            k: _coerce(v)
            for k, v in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
        }
    except ValueError:
        raise JudgeSpecError(
            f"judge spec {spec!r}: the part after '?' must be key=value pairs joined by '&'"
        ) from None
    if name == "rule":
        if params:
            raise JudgeSpecError(f"the rule judge takes no parameters, got {sorted(params)}")
        return RuleJudge()
    cache = params.pop("cache", None)
    retries = int(params.pop("retries", 2))
    if "model" not in params:
        raise JudgeSpecError(f"judge spec {spec!r} needs model=NAME; {JUDGE_SPEC_HELP}")
    try:
        backend = backend_class("openai")(**params)
    except (TypeError, ValueError) as exc:
        raise JudgeSpecError(f"judge spec {spec!r}: {exc}") from None
    return LLMJudge(backend, cache_path=None if cache is None else str(cache), retries=retries)
