"""Episode transcripts: a JSONL schema, a crash-safe writer, a verifying reader and migrations.

A transcript is one JSON object per line (UTF-8, ``\\n``-terminated), in this order:

1. one ``header`` (schema version, package version, the fully resolved scenario, seed, seats,
   judge version);
2. ``step`` events, one per ``env.step`` (seat, phase, observation digest, the action exactly as
   the env received it, LLM prompt/raw output, the env's info, every reward and reward component
   paid by that step, tokens, latency, the env's state digest), interleaved with
3. ``round`` summaries (``env.round_log`` entries: mechanism, bids, clearing, allocations,
   payments, shocks, judge verdicts), each written right after the step that closed the round;
4. one ``footer`` (status, totals, and the SHA-256 of every byte before the footer line).

Digest chain: every record ends with ``"prev"`` (the previous record's digest; the header's is
:data:`GENESIS`) and ``"digest"`` = SHA-256 of the line's text up to (not including) the
``,"digest":...`` suffix. Changing any byte of any line breaks that line's digest or the next
line's ``prev``; :func:`read_transcript` names the line.

Numbers that JSON cannot hold (NaN, +/-inf) are written as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``, so every line parses in any JSON reader (browsers included).

The published JSON schema is ``docs/transcript.schema.json`` (regenerate with
``python -m market.record.transcript --schema > docs/transcript.schema.json``; a test checks it is
current). Reading: :func:`read_transcript` never raises anything but :class:`TranscriptError`
(a clear one-line message) and reports a cut-off file as ``incomplete`` instead of failing.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

SCHEMA_VERSION = 2
"""Current schema version. 1: the first draft (no digest chain, no ``action_kind``); migrated in
memory by :func:`migrate`. Anything newer than this is refused with a clear error."""
GENESIS = "0" * 64
"""The ``prev`` of a header: there is no record before it."""

NonFinite = Literal["NaN", "Infinity", "-Infinity"]
Num = float | NonFinite
ActionKind = Literal["model", "json", "text", "none", "opaque"]


# ---------------------------------------------------------------------------------------------
# schema (pydantic models; docs/transcript.schema.json is generated from these)
# ---------------------------------------------------------------------------------------------
class _Record(BaseModel):
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


class Header(_Record):
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


class StepEvent(_Record):
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


class RoundSummary(_Record):
    type: Literal["round"] = "round"
    i: int = Field(description="Index of the step that closed the round.")
    round: int
    summary: dict[str, Any] = Field(
        description="The env.round_log entry: mechanism, reserve, price, "
        "bids, won, paid, judge verdicts, penalties, shocks, "
        "welfare, designer metrics."
    )


class Footer(_Record):
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


# ---------------------------------------------------------------------------------------------
# JSON helpers
# ---------------------------------------------------------------------------------------------
class TranscriptError(ValueError):
    """A transcript cannot be used as asked; the message says why (one line, no traceback)."""


def _nonfinite(x: float) -> NonFinite:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _key(k: Any) -> str:
    """A dict key as ``json.dumps`` writes it."""
    if isinstance(k, str):
        return k
    if isinstance(k, bool) or k is None:
        return json.dumps(k)
    if isinstance(k, int | float):
        return json.dumps(k) if not isinstance(k, float) or math.isfinite(k) else _nonfinite(k)
    return str(k)


def jsonable(x: Any) -> Any:
    """``x`` as plain JSON data: numpy scalars/arrays, tuples, sets, models and dataclasses
    converted, dict keys made strings, non-finite floats written as strings, anything else repr'd.
    Finite floats are kept as floats, so they round-trip through JSON exactly."""
    if x is None or isinstance(x, bool | str | int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else _nonfinite(x)
    if isinstance(x, dict):
        return {_key(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, set | frozenset):
        return sorted((jsonable(v) for v in x), key=repr)
    if isinstance(x, BaseModel):
        return jsonable(x.model_dump(mode="python"))
    if hasattr(x, "tolist") and hasattr(x, "dtype"):  # numpy scalar or array
        return jsonable(x.tolist())
    if hasattr(x, "__dataclass_fields__"):
        return jsonable({k: getattr(x, k) for k in x.__dataclass_fields__})
    return repr(x)


def encode_action(action: Any, designer: bool = False) -> tuple[ActionKind, Any]:
    """(kind, value): the action exactly as the env will receive it, as JSON (see StepEvent)."""
    if action is None:
        return "none", None
    if isinstance(action, bytes | bytearray):
        return "text", bytes(action).decode("utf-8", errors="replace")  # as parse_action does
    if isinstance(action, str):
        return "text", action
    if isinstance(action, BaseModel):
        return "model", action.model_dump(mode="json")
    if type(action) in (dict, list, int, float, bool):
        try:
            text = json.dumps(action, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            pass
        else:
            if json.loads(text) == action:  # tuples, numpy ints and the like fall through
                return "json", action
    from market.core.actions import ActionParseError, parse_action

    try:
        parsed = parse_action(action, designer=designer)
    except ActionParseError:
        return "opaque", repr(action)[:500]
    except Exception:  # an agent's object whose methods raise: still never fail the recording
        return "opaque", f"<unprintable {type(action).__name__}>"
    return "model", parsed.model_dump(mode="json")


class _Opaque:
    """Stands in for an action that could not be recorded: the env rejects it as it did the
    original (replay then checks that *an* error occurred, not its wording)."""

    def __repr__(self) -> str:
        return "<unrecorded action>"


def decode_action(kind: str, value: Any) -> Any:
    """What replay feeds to ``env.step`` for a recorded action."""
    if kind == "opaque":
        return _Opaque()
    if kind == "none":
        return None
    return value


def _digest_line(body: str) -> tuple[str, str]:
    """(digest, line) for a record serialised as ``body`` (ending in ``"prev":"..."}``)."""
    digest = hashlib.sha256(body.encode("ascii")).hexdigest()
    return digest, f'{body[:-1]},"digest":"{digest}"}}\n'


_SUFFIX_LEN = len(',"digest":""}') + 64


def _dumps(record: dict[str, Any]) -> str:
    """One JSON line; the same text as dumping ``jsonable(record)``, but it only walks the data in
    Python when the C encoder meets something it cannot write (non-finite floats, numpy keys)."""
    try:
        return json.dumps(
            record, ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=jsonable
        )
    except (ValueError, TypeError):
        return json.dumps(
            jsonable(record), ensure_ascii=True, allow_nan=False, separators=(",", ":")
        )


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------
class TranscriptWriter:
    """Appends chained records to a JSONL file, flushing every record (fsync on :meth:`sync`).

    A crash or Ctrl-C leaves every record already written intact; the record in flight is at
    worst a cut-off last line, which :func:`read_transcript` reports as incomplete.
    """

    def __init__(self, path: str | Path, sync_interval: float = 1.0) -> None:
        self.path = Path(path)
        self.sync_interval = sync_interval
        self._synced = time.monotonic()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: io.TextIOWrapper | None = open(self.path, "w", encoding="ascii", newline="\n")  # noqa: SIM115
        self._prev = GENESIS
        self._file_hash = hashlib.sha256()
        self.records = 0

    def write(self, record: dict[str, Any]) -> str:
        """Write one record (a dict of JSON data with a ``type``); returns its digest."""
        if self._fh is None:
            raise TranscriptError(f"{self.path}: transcript already closed")
        record = dict(record)
        record.pop("digest", None)
        record["prev"] = self._prev
        digest, line = _digest_line(_dumps(record))
        self._fh.write(line)
        self._fh.flush()
        self._file_hash.update(line.encode("ascii"))
        self._prev = digest
        self.records += 1
        return digest

    def sync(self, force: bool = False) -> None:
        """fsync, at most every ``sync_interval`` seconds unless ``force`` (called at round ends
        and on close). Every record is flushed to the OS as written, which is all a process crash
        or Ctrl-C needs; fsync also bounds what an OS crash or power loss can take."""
        if self._fh is None:
            return
        self._fh.flush()
        now = time.monotonic()
        if force or now - self._synced >= self.sync_interval:
            os.fsync(self._fh.fileno())
            self._synced = now

    def footer(self, record: dict[str, Any]) -> str:
        record = {**record, "type": "footer", "file_sha256": self._file_hash.hexdigest()}
        digest = self.write(record)
        self.close()
        return digest

    def close(self) -> None:
        if self._fh is not None:
            self.sync()
            self._fh.close()
            self._fh = None

    def __enter__(self) -> TranscriptWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _package_version() -> str:
    try:
        from market import __version__

        return str(__version__)
    except Exception:  # pragma: no cover - a broken install still records
        return "unknown"


def _judge_version() -> str:
    try:
        from market.core import judge

        return str(getattr(judge, "JUDGE_VERSION", "unknown"))
    except Exception:  # pragma: no cover - the judge module is optional for recording
        return "unknown"


def _judge_name(env: Any) -> str:
    """``rule/rubric-1`` or ``llm/rubric-1/MODEL``: the env's judge, else the judge version."""
    judge = getattr(env, "judge", None)
    try:
        return str(judge.describe()) if judge is not None else _judge_version()
    except Exception:  # pragma: no cover - a judge without describe()
        return _judge_version()


def seat_spec(spec: Any, agent: Any) -> dict[str, Any]:
    """The header's description of a seat: spec, agent name, kind (llm/scripted) and model."""
    name = getattr(agent, "name", type(agent).__name__)
    text = spec if isinstance(spec, str) else str(name)
    is_llm = text.startswith("llm:") or hasattr(agent, "last_exchange")
    model = getattr(agent, "model", None) if is_llm else None
    return {
        "spec": text,
        "name": str(name),
        "kind": "llm" if is_llm else "scripted",
        "model": model if isinstance(model, str) else None,
        "rebuildable": isinstance(spec, str),
    }


class EpisodeRecorder:
    """Records one episode as the runner plays it: ``before_step``/``after_step`` around every
    ``env.step``, then ``finish``.

    ``digest_every``: the observation and state digests are recorded every N steps (the state
    digest also after every round end); 1, the default, records them at every step.
    ``sync_interval``: fsync at round ends at most this often (seconds); see TranscriptWriter.
    """

    def __init__(
        self,
        path: str | Path,
        env: Any,
        seed: int,
        specs: dict[str, Any],
        agents: dict[str, Any],
        digest_every: int = 1,
        sync_interval: float = 1.0,
    ) -> None:
        if digest_every < 1:
            raise ValueError(f"digest_every must be at least 1, got {digest_every}")
        self.env = env
        self.agents = agents
        self.digest_every = digest_every
        self.writer = TranscriptWriter(path, sync_interval)
        self.path = self.writer.path
        self.steps = 0
        self._rounds = 0
        self._obs: dict[str, tuple[Any, str]] = {}
        self._exchange: dict[str, Any] = {}
        self._tokens: dict[str, dict[str, float]] = {
            s: self._token_stats(a) for s, a in agents.items()
        }
        self._pending: dict[str, Any] | None = None
        sc = env.scenario
        self.writer.write(
            {
                "type": "header",
                "schema_version": SCHEMA_VERSION,
                "package": "gpumarket",
                "package_version": _package_version(),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "platform": sys.platform,
                "scenario_name": sc.name,
                "scenario": sc.model_dump(mode="json"),
                "seed": int(seed),
                "seats": {s: seat_spec(specs.get(s, a), a) for s, a in agents.items()},
                "possible_agents": list(env.possible_agents),
                "judge": _judge_name(env),
                "digest_every": digest_every,
            }
        )

    @staticmethod
    def _token_stats(agent: Any) -> dict[str, float]:
        stats = getattr(agent, "stats", None) or {}
        return {
            k: float(v) for k, v in stats.items() if "token" in k and isinstance(v, int | float)
        }

    def _obs_digest(self, seat: str, obs: Any) -> str | None:
        if obs is None:
            return None
        cached = self._obs.get(seat)
        if cached is not None and cached[0] is obs:  # the env reuses unchanged observations
            return cached[1]
        try:
            data = obs.model_dump_json() if isinstance(obs, BaseModel) else repr(obs)
        except Exception:  # pragma: no cover - an exotic observation must not stop recording
            data = repr(obs)
        digest = hashlib.sha256(data.encode("utf-8", errors="replace")).hexdigest()[:16]
        self._obs[seat] = (obs, digest)
        return digest

    def before_step(
        self,
        seat: str,
        obs: Any,
        action: Any,
        live: bool,
        latency: float | None = None,
        agent_error: str | None = None,
    ) -> None:
        """Call just before ``env.step(action)``; records what the seat saw and did."""
        env = self.env
        from market.environment.aec import DESIGNER

        kind, value = encode_action(action, designer=seat == DESIGNER)
        event: dict[str, Any] = {
            "type": "step",
            "i": self.steps,
            "seat": seat,
            "round": int(env.round),
            "phase": env.phase,
            "live": live,
            "obs_digest": self._obs_digest(seat, obs)
            if live and self.steps % self.digest_every == 0
            else None,
            "action_kind": kind,
            "action": value,
        }
        agent = self.agents.get(seat)
        # after an agent error or timeout the exchange and stats may belong to a call that is
        # still running (on a worker thread): record them only for a decision that returned
        if live and agent is not None and agent_error is None:
            exchange = getattr(agent, "last_exchange", None)
            if isinstance(exchange, dict) and exchange is not self._exchange.get(seat):
                self._exchange[seat] = exchange
                try:
                    event["llm"] = jsonable(exchange)
                except RecursionError:
                    event["llm"] = {
                        "error": "last_exchange could not be recorded (nested too deep)"
                    }
            now = self._token_stats(agent)
            before = self._tokens.get(seat, {})
            delta = {k: v - before.get(k, 0.0) for k, v in now.items() if v != before.get(k, 0.0)}
            if delta:
                event["tokens"] = delta
            self._tokens[seat] = now
            if latency is not None:
                event["latency_s"] = round(latency, 6)
        if agent_error is not None:
            event["agent_error"] = agent_error[:1000]
        self._pending = event

    def after_step(self) -> None:
        """Call right after ``env.step``; writes the step event and any round summary."""
        env, event = self.env, self._pending
        if event is None:
            raise RuntimeError("after_step without before_step")
        self._pending = None
        seat = event["seat"]
        info = env.infos.get(seat, {}) if event["live"] else {}
        event["info"] = {k: info[k] for k in ("action", "result", "error") if k in info}
        rewards = {a: r for a, r in env.rewards.items() if r != 0.0}
        event["rewards"] = rewards
        event["components"] = {
            a: env.infos.get(a, {}).get("reward_components", {}) for a in rewards
        }
        round_closed = len(env.round_log) > self._rounds
        if round_closed or self.steps % self.digest_every == 0 or env.phase == "done":
            event["state_digest"] = env.state_digest()
        self.writer.write(event)
        while self._rounds < len(env.round_log):
            entry = env.round_log[self._rounds]
            self.writer.write(
                {
                    "type": "round",
                    "i": self.steps,
                    "round": int(entry.get("round", self._rounds)),
                    "summary": entry,
                }
            )
            self._rounds += 1
        if round_closed:
            self.writer.sync()
        self.steps += 1

    def finish(self, result: Any | None = None, error: BaseException | None = None) -> None:
        """Write the footer: ``complete`` with the episode's totals, or ``aborted`` on ``error``."""
        if self.writer._fh is None:
            return
        record: dict[str, Any] = {
            "status": "complete" if error is None else "aborted",
            "steps": self.steps,
            "rounds": self._rounds,
        }
        if error is not None:
            record["error"] = f"{type(error).__name__}: {error}"[:1000]
        if result is not None:
            record.update(
                returns=jsonable(result.returns),
                components=jsonable(result.components),
                invalid_actions=jsonable(result.invalid_actions),
                agent_errors=jsonable(result.agent_errors),
                agent_stats=jsonable(result.agent_stats),
                seconds=round(result.seconds, 6),
            )
        self.writer.footer(record)

    def close(self) -> None:
        self.writer.close()


# ---------------------------------------------------------------------------------------------
# reading, verifying, migrating
# ---------------------------------------------------------------------------------------------
_MODELS: dict[str, type[_Record]] = {
    "header": Header,
    "step": StepEvent,
    "round": RoundSummary,
    "footer": Footer,
}


@dataclass
class Transcript:
    """A transcript as read: the records, whether the digest chain held, and what is missing."""

    path: Path | None
    header: Header
    steps: list[StepEvent] = field(default_factory=list)
    rounds: list[RoundSummary] = field(default_factory=list)
    footer: Footer | None = None
    records: list[tuple[int, _Record]] = field(default_factory=list)  # (line number, record)
    source_version: int = SCHEMA_VERSION
    chain: Literal["verified", "unverified", "skipped"] = "verified"
    incomplete: str | None = None  # why the file is not a complete episode; None when it is
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.incomplete is None


def _where(record: dict[str, Any] | None, n: int) -> str:
    if not isinstance(record, dict):
        return f"line {n}"
    kind = record.get("type")
    if kind == "step" and isinstance(record.get("i"), int):
        return f"line {n} (step {record['i']})"
    if kind == "round" and isinstance(record.get("round"), int):
        return f"line {n} (round {record['round']} summary)"
    return f"line {n} ({kind})" if isinstance(kind, str) else f"line {n}"


def _migrate_v1(record: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: v1 had no digest chain and no ``action_kind`` (it is inferred)."""
    record = dict(record)
    record.pop("prev", None)
    record.pop("digest", None)
    if record.get("type") == "header":
        record["schema_version"] = SCHEMA_VERSION
    if record.get("type") == "step" and "action_kind" not in record:
        action = record.get("action")
        record["action_kind"] = (
            "none" if action is None else ("text" if isinstance(action, str) else "json")
        )
    if record.get("type") == "footer":
        record.setdefault("file_sha256", "")
    return record


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _migrate_v1}
"""``MIGRATIONS[v]`` upgrades one record of schema ``v`` to ``v + 1`` (applied in memory)."""


def migrate(record: dict[str, Any], version: int) -> dict[str, Any]:
    """One record of schema ``version`` upgraded to :data:`SCHEMA_VERSION`."""
    while version < SCHEMA_VERSION:
        record = MIGRATIONS[version](record)
        version += 1
    return record


def _check_version(header: dict[str, Any], name: str) -> int:
    version = header.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise TranscriptError(
            f"{name}: line 1 has no integer 'schema_version': not a gpumarket transcript"
        )
    if version > SCHEMA_VERSION:
        raise TranscriptError(
            f"{name}: written by a newer gpumarket (transcript schema v{version}; this gpumarket "
            f"{_package_version()} reads v1..v{SCHEMA_VERSION}); upgrade gpumarket to read it"
        )
    if version < 1 or (
        version < SCHEMA_VERSION
        and not all(v in MIGRATIONS for v in range(version, SCHEMA_VERSION))
    ):
        raise TranscriptError(
            f"{name}: transcript schema v{version} is not supported (this gpumarket "
            f"reads v1..v{SCHEMA_VERSION}); re-record the episode"
        )
    return version


def read_transcript(source: str | Path, verify: bool = True) -> Transcript:
    """Read, verify and (if older) migrate a transcript. Raises only :class:`TranscriptError`.

    ``verify``: check the digest chain and the footer's file digest (an edited byte is an error
    naming the line). A file cut mid-line, without a footer, or with an ``aborted`` footer is
    returned with :attr:`Transcript.incomplete` saying so; the complete records before are kept.
    """
    path = Path(source)
    name = str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TranscriptError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise TranscriptError(f"{name}: is a directory, not a transcript file") from None
    except OSError as exc:
        raise TranscriptError(f"{name}: cannot read: {exc.strerror or exc}") from None
    return parse_transcript(data, name=name, verify=verify, path=path)


def parse_transcript(
    data: bytes, name: str = "<transcript>", verify: bool = True, path: Path | None = None
) -> Transcript:
    """:func:`read_transcript` on bytes already in memory."""
    if not data.strip():
        raise TranscriptError(f"{name}: empty file: not a transcript")
    pieces = data.split(b"\n")
    cut_tail = pieces[-1] != b""  # a last line without its newline: written when the run stopped
    lines = pieces if cut_tail else pieces[:-1]
    prev, offset = GENESIS, 0
    file_hash = hashlib.sha256()
    version = SCHEMA_VERSION
    out: Transcript | None = None
    steps_seen = 0
    for n, raw in enumerate(lines, start=1):
        last = n == len(lines)
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            record = None
        if not isinstance(record, dict):
            if last and cut_tail and n > 1 and out is not None:
                out.incomplete = (
                    f"incomplete transcript: cut at line {n} (the step in flight was lost); "
                    f"{steps_seen} complete steps"
                )
                return out
            if n == 1:
                raise TranscriptError(
                    f"{name}: line 1 is not a JSON object: not a gpumarket transcript"
                    + (" (or it was cut inside the header)" if last and cut_tail else "")
                )
            raise TranscriptError(
                f"{name}: {_where(record, n)} is not valid JSON: the file was edited or "
                "corrupted (only a cut-off last line is tolerated)"
            )
        if n == 1:
            if record.get("type") != "header":
                raise TranscriptError(
                    f"{name}: line 1 is not a transcript header (type "
                    f"{record.get('type')!r}): not a gpumarket transcript"
                )
            version = _check_version(record, name)
        elif record.get("type") == "header":
            raise TranscriptError(
                f"{name}: {_where(record, n)}: a second header: two transcripts were "
                "concatenated or the file was edited"
            )
        if version >= 2 and verify:
            if record.get("prev") != prev:
                raise TranscriptError(
                    f"{name}: {_where(record, n)}: its 'prev' does not match the digest of "
                    f"line {n - 1}: a line was removed, reordered or edited after it was written"
                )
            suffix = raw[-_SUFFIX_LEN:]
            body = raw[:-_SUFFIX_LEN] + b"}"
            if not suffix.startswith(b',"digest":"') or hashlib.sha256(
                body
            ).hexdigest() != record.get("digest"):
                raise TranscriptError(
                    f"{name}: {_where(record, n)}: digest mismatch: the line was edited "
                    "after it was written"
                )
            if (
                record.get("type") == "footer"
                and record.get("file_sha256") != file_hash.hexdigest()
            ):
                raise TranscriptError(
                    f"{name}: {_where(record, n)}: 'file_sha256' does not match the "
                    "bytes before the footer: the file was edited"
                )
            prev = record["digest"]
        file_hash.update(raw + b"\n")
        offset += len(raw) + 1
        if version < SCHEMA_VERSION:
            record = migrate(record, version)
        kind = record.get("type")
        model = _MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise TranscriptError(
                f"{name}: {_where(record, n)}: unknown record type {kind!r} "
                "(expected header, step, round or footer)"
            )
        try:
            parsed = model.model_validate(record)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or "(record)"
            raise TranscriptError(
                f"{name}: {_where(record, n)}: invalid {kind} record: field '{loc}': {err['msg']}"
            ) from None
        if out is None:
            assert isinstance(parsed, Header)
            out = Transcript(
                path=path,
                header=parsed,
                source_version=version,
                chain=("verified" if verify else "skipped") if version >= 2 else "unverified",
            )
            if version < SCHEMA_VERSION:
                out.notes.append(
                    f"migrated from schema v{version} to v{SCHEMA_VERSION} in memory"
                    + (
                        " (v1 has no digest chain: edits cannot be detected)"
                        if version == 1
                        else ""
                    )
                )
            out.records.append((n, parsed))
            continue
        if out.footer is not None:
            raise TranscriptError(
                f"{name}: {_where(record, n)}: a record after the footer: the file was "
                "edited or two transcripts were concatenated"
            )
        if isinstance(parsed, StepEvent):
            if parsed.i != steps_seen:
                raise TranscriptError(
                    f"{name}: {_where(record, n)}: expected step {steps_seen}: steps are "
                    "missing or out of order"
                )
            steps_seen += 1
            out.steps.append(parsed)
        elif isinstance(parsed, RoundSummary):
            out.rounds.append(parsed)
        elif isinstance(parsed, Footer):
            out.footer = parsed
        out.records.append((n, parsed))
    assert out is not None
    if out.footer is None:
        out.incomplete = (
            f"incomplete transcript: no footer after line {len(lines)} (the run stopped "
            f"before the episode ended); {steps_seen} complete steps"
        )
    elif out.footer.status != "complete":
        out.incomplete = (
            "incomplete transcript: the run was aborted "
            f"({out.footer.error or 'no reason given'}); "
            f"{steps_seen} complete steps"
        )
    return out


def records_of(t: Transcript) -> list[dict[str, Any]]:
    """The records as plain dicts (no ``prev``/``digest``), e.g. to edit and :func:`rewrite`."""
    return [r.model_dump(mode="json", exclude={"prev", "digest"}) for _, r in t.records]


def rewrite(path: str | Path, records: list[dict[str, Any]]) -> Path:
    """Write ``records`` as a freshly chained transcript (current schema; the footer's file
    digest is recomputed). Used to upgrade old files and by tests to forge consistent edits."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    writer = TranscriptWriter(tmp)
    try:
        for record in records:
            record = {k: v for k, v in record.items() if k not in ("prev", "digest")}
            if record.get("type") == "header":
                record["schema_version"] = SCHEMA_VERSION
            if record.get("type") == "footer":
                writer.footer(record)
            else:
                writer.write(record)
    finally:
        writer.close()
    os.replace(tmp, path)
    return path


def schema_text() -> str:
    """The text of docs/transcript.schema.json."""
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"


def steps_per_second(
    scenario: str = "market_round",
    seconds: float = 1.0,
    digest_every: int = 1,
    seats: dict[str, str] | None = None,
) -> dict[str, float]:
    """Measure recording overhead: steps/s of episodes with and without a transcript."""
    import tempfile

    from market.run.rollout import run_episode

    def rate(record: bool) -> float:
        steps, start, seed = 0, time.perf_counter(), 0
        with tempfile.TemporaryDirectory() as d:
            while time.perf_counter() - start < seconds:
                res = run_episode(
                    scenario,
                    seed,
                    seats,
                    transcript=Path(d) / f"{seed}.jsonl" if record else None,
                    digest_every=digest_every,
                )
                steps += res.steps
                seed += 1
        return steps / (time.perf_counter() - start)

    rate(False)  # warm up
    plain, recorded = rate(False), rate(True)
    return {
        "plain_steps_per_s": plain,
        "recorded_steps_per_s": recorded,
        "overhead_pct": 100.0 * (plain / recorded - 1.0),
    }


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m market.record.transcript",
        description="Print the transcript JSON schema or check files.",
    )
    parser.add_argument("--schema", action="store_true", help="print docs/transcript.schema.json")
    parser.add_argument("files", nargs="*", type=Path, help="transcripts to read and verify")
    args = parser.parse_args(argv)
    if args.schema:
        sys.stdout.write(schema_text())
    status = 0
    for f in args.files:
        try:
            t = read_transcript(f)
        except TranscriptError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
            continue
        state = "complete" if t.complete else t.incomplete
        print(
            f"{f}: schema v{t.source_version}, {t.header.scenario_name} seed {t.header.seed}, "
            f"{len(t.steps)} steps, {len(t.rounds)} rounds, chain {t.chain}; {state}"
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
