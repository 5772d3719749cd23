"""The transcript schema: the pydantic models of its four record types (header, step event,
round summary, footer), the format's constants and its published JSON schema.

This is the one model of a transcript: the writer (:mod:`market.record.writer`) writes these
records, the reader (:mod:`market.record.reader`) validates every line into them, and the report
and viewer read them. ``docs/transcript.schema.json`` is generated from these models
(``python -m market.record.transcript --schema``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from market.version import __version__

SCHEMA_VERSION = 2
"""Current schema version. 1: the first draft (no digest chain, no ``action_kind``); migrated in
memory by :func:`migrate`. Anything newer than this is refused with a clear error."""
GENESIS = "0" * 64
"""The ``prev`` of a header: there is no record before it."""

NonFinite = Literal["NaN", "Infinity", "-Infinity"]
Num = float | NonFinite
ActionKind = Literal["model", "json", "text", "none", "opaque"]


DIGEST_SUFFIX_LEN = len(',"digest":""}') + 64
"""Length of the ``,"digest":"<64 hex>"}`` suffix that ends every chained line."""


class BaseRecord(BaseModel):
    model_config = ConfigDict(extra="allow")  # readers must tolerate fields added later

    prev: str = Field(
        GENESIS, description="Digest of the previous record (GENESIS for the header)."
    )
    digest: str = Field(
        "", description="SHA-256 of this line's text before the ',\"digest\"' suffix."
    )


class SeatSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    spec: str = Field(
        description="The seat spec as given (e.g. 'truthful', 'llm:openai?model=...'), "
        "or the agent's name when an agent object was passed."
    )
    name: str = Field(description="The agent's name.")
    kind: Literal["scripted", "llm", "other"] = Field(
        description="llm seats record prompts and raw output."
    )
    model: str | None = Field(None, description="Model name for LLM seats.")
    rebuildable: bool = Field(
        True,
        description="False when the seat was an agent object, so "
        "'replay --update' cannot build it again from 'spec'.",
    )


class Header(BaseRecord):
    type: Literal["header"] = "header"
    schema_version: int = SCHEMA_VERSION
    package: str = "gpumarket"
    package_version: str
    created: str = Field(description="UTC ISO-8601 time the recording started.")
    python: str = ""
    platform: str = ""
    scenario_name: str
    scenario: dict[str, Any] = Field(
        description="The fully resolved scenario "
        "(Scenario.model_dump(mode='json')); replay uses it, "
        "not the built-in file."
    )
    seed: int
    seats: dict[str, SeatSpec]
    possible_agents: list[str]
    judge: str = Field(
        description="The judge and its rubric version, e.g. 'rule/rubric-1' or "
        "'llm/rubric-1/MODEL' (the spec is scenario.judge)."
    )
    digest_every: int = Field(
        1,
        description="obs_digest and state_digest are recorded every N steps "
        "(state_digest also at round ends).",
    )
    conduct_judge: str | None = Field(
        None,
        description="Who read seats' text for the conduct judge, e.g. 'rule/conduct-rules-1' "
        "(absent: recorded before the conduct judge; docs/conduct.md).",
    )


class LLMExchange(BaseModel):
    """What an LLM seat saw and said (``agent.last_exchange``); absent for scripted seats."""

    model_config = ConfigDict(extra="allow")

    messages: list[Any] | None = Field(
        None, description="The prompt (chat messages, last attempt)."
    )
    raw: str | None = Field(None, description="The model's raw text output (last attempt).")
    action: Any = Field(None, description="The action the agent parsed from it (or its fallback).")
    error: str | None = Field(None, description="Parse/request error the agent reported.")


class StepInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    action: str | None = Field(None, description="The action_type the env accepted.")
    result: Any = Field(None, description="infos[seat]['result']: what the action did.")
    error: str | None = Field(None, description="infos[seat]['error']: why the action was invalid.")


class StepEvent(BaseRecord):
    type: Literal["step"] = "step"
    i: int = Field(description="Step index, from 0.")
    seat: str
    round: int
    phase: str = Field(description="Phase before the step: design, negotiation, bidding or done.")
    live: bool = Field(True, description="False for a terminated seat stepped with None.")
    obs_digest: str | None = Field(
        None, description="SHA-256 (16 hex) of the observation the seat acted on."
    )
    action_kind: ActionKind = Field(
        description="How the agent gave the action: model (an ActionModel "
        "or a non-JSON value the env parsed: stored as the "
        "parsed action's JSON dump), json (a dict or other "
        "JSON value, stored as is), text (a string, stored "
        "verbatim), none (null), opaque (neither serialisable "
        "nor parseable: stored as repr, replayed as an "
        "invalid action)."
    )
    action: Any = Field(description="The action exactly as the env received it (see action_kind).")
    llm: LLMExchange | None = None
    agent_error: str | None = Field(
        None, description="The agent raised or timed out; the fallback action was played."
    )
    info: StepInfo = StepInfo()
    rewards: dict[str, Num] = Field(
        default_factory=dict, description="Every seat's non-zero reward paid by this step."
    )
    components: dict[str, dict[str, Num]] = Field(
        default_factory=dict, description="Reward components of those seats."
    )
    state_digest: str | None = Field(
        None, description="env.state_digest() after the step (null when skipped by digest_every)."
    )
    tokens: dict[str, float] | None = Field(
        None, description="Token counts this step (agent.stats deltas)."
    )
    latency_s: float | None = Field(None, description="Wall time of the agent's act/aact call.")
    conduct: list[dict[str, Any]] | None = Field(
        None,
        description="The conduct judge's entries of this step: claims with their verdicts, "
        "promises made (pending) or decided, manipulation flags (docs/conduct.md).",
    )
    conduct_reader: list[dict[str, Any]] | None = Field(
        None,
        description="A model conduct reader's exchanges this step (prompt messages, replies, "
        "outcome, cached): what the model was asked and said (docs/conduct.md).",
    )


class RoundSummary(BaseRecord):
    type: Literal["round"] = "round"
    i: int = Field(description="Index of the step that closed the round.")
    round: int
    summary: dict[str, Any] = Field(
        description="The env.round_log entry: mechanism, reserve, price, "
        "bids, won, paid, judge verdicts, penalties, shocks, "
        "welfare, designer metrics."
    )
    conduct: dict[str, Any] | None = Field(
        None,
        description="{'verdicts': promises decided at this round's close, 'scores': per-seat "
        "conduct scores so far} (docs/conduct.md).",
    )


class Footer(BaseRecord):
    type: Literal["footer"] = "footer"
    status: Literal["complete", "aborted"] = Field(
        description="aborted: the run raised or was interrupted; the steps before are valid."
    )
    error: str | None = None
    steps: int
    rounds: int
    returns: dict[str, Num] = Field(default_factory=dict)
    components: dict[str, dict[str, Num]] = Field(default_factory=dict)
    invalid_actions: dict[str, int] = Field(default_factory=dict)
    agent_errors: dict[str, int] = Field(default_factory=dict)
    agent_stats: dict[str, dict[str, Any]] = Field(default_factory=dict)
    conduct: dict[str, dict[str, Any]] | None = Field(
        None, description="Per-seat conduct scores at the end (docs/conduct.md)."
    )
    seconds: float = 0.0
    file_sha256: str = Field(description="SHA-256 of all bytes before the footer line.")


Record = Annotated[Header | StepEvent | RoundSummary | Footer, Field(discriminator="type")]
_record_adapter: TypeAdapter[Any] = TypeAdapter(Record)


def json_schema() -> dict[str, Any]:
    """The published JSON schema of one transcript line (docs/transcript.schema.json)."""
    schema = _record_adapter.json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://gpumarket.invalid/transcript.schema.json"
    schema["title"] = "gpumarket transcript line"
    schema["description"] = (
        f"One line of a gpumarket JSONL transcript (schema_version {SCHEMA_VERSION}). A file is a "
        "header, then step events interleaved with round summaries, then a footer. See "
        "docs/transcripts.md."
    )
    schema["x-schema-version"] = SCHEMA_VERSION
    return schema


AnyRecord = Header | StepEvent | RoundSummary | Footer
"""One validated record of any type."""

RECORD_MODELS: dict[str, type[Header] | type[StepEvent] | type[RoundSummary] | type[Footer]] = {
    "header": Header,
    "step": StepEvent,
    "round": RoundSummary,
    "footer": Footer,
}
"""The model of each record ``type``."""


class TranscriptError(ValueError):
    """A transcript cannot be used as asked; the message says why (one line, no traceback)."""


def package_version() -> str:
    """The gpumarket version written into headers and named in version errors."""
    return str(__version__)


def schema_text() -> str:
    """The text of docs/transcript.schema.json."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
