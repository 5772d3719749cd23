"""Writing transcripts: records encoded as JSON lines (non-finite numbers as strings, actions as
recorded), the digest-chained crash-safe :class:`TranscriptWriter`, the :class:`EpisodeRecorder`
that the runner drives around every ``env.step``, and :func:`rewrite` (re-chain edited records).

A transcript holds every seat's private state and the episode's seed, so every file written here
(and its ``.tmp`` / ``.new`` siblings) is created with mode 0600, owner only, whatever the umask;
a seat's spec is recorded with its secrets masked (:func:`agents.specs_redact.redact_spec`), and so
are agent errors and the footer's error text.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agents.specs_redact import redact_spec, redact_text
from market.core import judge
from market.core.actions import ActionParseError, parse_action
from market.core.seats import DESIGNER
from market.environment.observations import digest_json
from market.record.schema import (
    GENESIS,
    SCHEMA_VERSION,
    ActionKind,
    NonFinite,
    TranscriptError,
    package_version,
)


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
    try:
        parsed = parse_action(action, designer=designer)
    except ActionParseError:
        return "opaque", repr(action)[:500]
    except Exception:  # an agent's object whose methods raise: still never fail the recording
        return "opaque", f"<unprintable {type(action).__name__}>"
    return "model", parsed.model_dump(mode="json")


def _make_encoder(default: Any) -> Callable[[Any], str]:
    """A reusable compact, ASCII-only, NaN-refusing JSON encoder: the same text as ``json.dumps``
    with those settings. The C encoder is made once, without the circular-reference check (a
    cycle ends in RecursionError, as it did through ``jsonable``); it keeps no state between
    calls, so threads may share it."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - an interpreter without the C accelerator
        encoder = json.JSONEncoder(
            ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=default
        )
        return encoder.encode
    chunks = make(
        None, default, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False
    )

    def encode(record: Any) -> str:
        return "".join(chunks(record, 0))

    return encode


_encode_fast = _make_encoder(jsonable)
_encode_plain = _make_encoder(None)


def _dumps(record: dict[str, Any]) -> str:
    """One JSON line; the same text as dumping ``jsonable(record)``, but it only walks the data in
    Python when the C encoder meets something it cannot write (non-finite floats, numpy keys)."""
    try:
        return _encode_fast(record)
    except (ValueError, TypeError):
        return _encode_plain(jsonable(record))


def _chained(record: dict[str, Any], prev: str) -> tuple[str, bytes]:
    """(digest, line) of ``record`` chained after ``prev``: the record's JSON with ``prev`` as its
    last key (``digest`` dropped), then the SHA-256 of that text added as ``digest``.

    The record is encoded once and ``prev`` appended to the text, which is the text of the
    record with the key set, so no copy of the record is made; a record that already has a
    ``prev`` (it keeps its place) or a ``digest`` is copied and edited first."""
    if "prev" in record or "digest" in record or not record:
        record = dict(record)
        record.pop("digest", None)
        record["prev"] = prev
        body = _dumps(record)
    else:
        body = f'{_dumps(record)[:-1]},"prev":"{prev}"}}'
    data = body.encode("ascii")
    digest = hashlib.sha256(data).hexdigest()
    return digest, f'{body[:-1]},"digest":"{digest}"}}\n'.encode("ascii")


#: a transcript's file mode: it holds every private value and the seed
PRIVATE_MODE = 0o600


def open_private(path: Path) -> io.RawIOBase:
    """``path`` truncated (or created) for unbuffered binary writing, mode 0600: created so (no
    moment where another user could open it), and set so on a file that already existed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, PRIVATE_MODE)
    try:
        if hasattr(os, "fchmod"):  # O_CREAT's mode applies only to a new file
            os.fchmod(fd, PRIVATE_MODE)
        return open(fd, "wb", buffering=0)  # noqa: SIM115
    except BaseException:
        os.close(fd)
        raise


def write_private(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as a transcript is written (mode 0600)."""
    with open_private(Path(path)) as fh:
        view = memoryview(data)
        while view:
            view = view[fh.write(view) or 0 :]


class TranscriptWriter:
    """Appends chained records to a JSONL file, handing every record to the OS as it is written
    (one ``write`` call per line, no buffer in the process; fsync on :meth:`sync`).

    A crash or Ctrl-C leaves every record already written intact; the record in flight is at
    worst a cut-off last line, which :func:`read_transcript` reports as incomplete.
    """

    def __init__(self, path: str | Path, sync_interval: float = 1.0) -> None:
        self.path = Path(path)
        self.sync_interval = sync_interval
        self._synced = time.monotonic()
        try:  # unbuffered: a write is a system call, so nothing waits in the process
            fh = open_private(self.path)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open_private(self.path)
        self._fh: io.RawIOBase | None = fh
        self._prev = GENESIS
        self._file_hash = hashlib.sha256()
        self.records = 0

    def write(self, record: dict[str, Any]) -> str:
        """Write one record (a dict of JSON data with a ``type``); returns its digest."""
        fh = self._fh
        if fh is None:
            raise TranscriptError(f"{self.path}: transcript already closed")
        digest, line = _chained(record, self._prev)
        written = fh.write(line)
        if written != len(line):  # a short write (a signal, a full disk): write the rest
            self._write_rest(memoryview(line)[written or 0 :])
        self._file_hash.update(line)
        self._prev = digest
        self.records += 1
        return digest

    def _write_rest(self, rest: memoryview) -> None:
        assert self._fh is not None
        while rest:
            n = self._fh.write(rest)
            rest = rest[n or 0 :]

    def sync(self, force: bool = False) -> None:
        """fsync, at most every ``sync_interval`` seconds unless ``force`` (called at round ends
        and on close). Every record is handed to the OS as written, which is all a process crash
        or Ctrl-C needs; fsync also bounds what an OS crash or power loss can take."""
        if self._fh is None:
            return
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


def _judge_version() -> str:
    return str(getattr(judge, "JUDGE_VERSION", "unknown"))


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
    shown = redact_spec(text)  # a token in the spec is never written (the file may be shared)
    return {
        "spec": shown,
        "name": str(name),
        "kind": "llm" if is_llm else "scripted",
        "model": model if isinstance(model, str) else None,
        # a masked spec no longer builds the agent that played
        "rebuildable": isinstance(spec, str) and shown == text,
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
                "package_version": package_version(),
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
                "conduct_judge": env.conduct.name,
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
        # a model's JSON bytes straight from its serializer: model_dump_json() is these bytes
        # decoded, and they are valid UTF-8, so the digest is that of model_dump_json()'s text
        try:
            data = (  # feedback fields left out (observations.FEEDBACK_FIELDS)
                digest_json(obs)
                if isinstance(obs, BaseModel)
                else repr(obs).encode("utf-8", errors="replace")
            )
        except Exception:  # pragma: no cover - an exotic observation must not stop recording
            data = repr(obs).encode("utf-8", errors="replace")
        digest = hashlib.sha256(data).hexdigest()[:16]
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
            before = self._tokens.get(seat)
            if before or getattr(agent, "stats", None):  # a scripted seat counts no tokens
                now = self._token_stats(agent)
                before = before or {}
                delta = {
                    k: v - before.get(k, 0.0) for k, v in now.items() if v != before.get(k, 0.0)
                }
                if delta:
                    event["tokens"] = delta
                self._tokens[seat] = now
            if latency is not None:
                event["latency_s"] = round(latency, 6)
        if agent_error is not None:
            event["agent_error"] = redact_text(agent_error[:1000])
        self._pending = event

    def after_step(self) -> None:
        """Call right after ``env.step``; writes the step event and any round summary."""
        env, event = self.env, self._pending
        if event is None:
            raise RuntimeError("after_step without before_step")
        self._pending = None
        infos = env.infos
        info = infos.get(event["seat"]) if event["live"] else None
        event["info"] = (
            {k: info[k] for k in ("action", "result", "error") if k in info} if info else {}
        )
        rewards = {a: r for a, r in env.rewards.items() if r != 0.0}
        event["rewards"] = rewards
        event["components"] = {a: infos.get(a, {}).get("reward_components", {}) for a in rewards}
        round_closed = len(env.round_log) > self._rounds
        if round_closed or self.steps % self.digest_every == 0 or env.phase == "done":
            event["state_digest"] = env.state_digest()
        # conduct entries are JSON-ready dicts: the encoder writes them as they are (and falls
        # back to jsonable() for the whole line if one holds what it cannot write)
        conduct = env.conduct
        if conduct.step_entries:
            event["conduct"] = conduct.step_entries
        if conduct.step_exchanges:
            event["conduct_reader"] = conduct.step_exchanges
        self.writer.write(event)
        while self._rounds < len(env.round_log):
            entry = env.round_log[self._rounds]
            self.writer.write(
                {
                    "type": "round",
                    "i": self.steps,
                    "round": int(entry.get("round", self._rounds)),
                    "summary": entry,
                    "conduct": env.conduct.rounds[self._rounds],
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
            record["error"] = redact_text(f"{type(error).__name__}: {error}"[:1000])
        if result is not None:
            record.update(
                returns=jsonable(result.returns),
                components=jsonable(result.components),
                invalid_actions=jsonable(result.invalid_actions),
                agent_errors=jsonable(result.agent_errors),
                agent_stats=jsonable(result.agent_stats),
                conduct=jsonable(self.env.conduct.score_dicts()),
                seconds=round(result.seconds, 6),
            )
        self.writer.footer(record)

    def close(self) -> None:
        self.writer.close()


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


def first_difference(expected: Any, actual: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """(path, expected, actual) of the first difference between two JSON values, or None.

    Strict: types must match and floats must be equal by ``repr`` (so -0.0 != 0.0, NaN == NaN).
    """
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in expected or key not in actual:
                return sub, expected.get(key, "<absent>"), actual.get(key, "<absent>")
            diff = first_difference(expected[key], actual[key], sub)
            if diff is not None:
                return diff
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for k, (e, a) in enumerate(zip(expected, actual, strict=False)):
            diff = first_difference(e, a, f"{path}[{k}]")
            if diff is not None:
                return diff
        if len(expected) != len(actual):
            return f"{path} (length)", len(expected), len(actual)
        return None
    if type(expected) is not type(actual) or repr(expected) != repr(actual):
        return path or "(value)", expected, actual
    return None
