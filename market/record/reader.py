"""Reading transcripts: :func:`read_transcript` validates every line into the typed records of
:mod:`market.record.schema` (checking the digest chain and migrating older schemas in memory) and
returns a :class:`Transcript`; :func:`decode_number` turns the strings that stand for non-finite
numbers back into floats (the one place that does), :func:`decode_action` a recorded action back
into what replay feeds to ``env.step``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from market.record.schema import (
    DIGEST_SUFFIX_LEN,
    GENESIS,
    RECORD_MODELS,
    SCHEMA_VERSION,
    AnyRecord,
    Footer,
    Header,
    NonFinite,
    RoundSummary,
    StepEvent,
    TranscriptError,
    package_version,
)

NON_FINITE: dict[NonFinite, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""The strings transcripts write for the numbers JSON cannot hold, and their values."""


def decode_number(x: Any) -> float:
    """A recorded number as a float: ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` decoded, other
    strings parsed by ``float`` (raising ``ValueError`` when they are not numbers)."""
    if isinstance(x, str):
        return NON_FINITE[x] if x in NON_FINITE else float(x)
    return float(x)


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


@dataclass
class Transcript:
    """A transcript as read: the records, whether the digest chain held, and what is missing."""

    path: Path | None
    header: Header
    steps: list[StepEvent] = field(default_factory=list)
    rounds: list[RoundSummary] = field(default_factory=list)
    footer: Footer | None = None
    records: list[tuple[int, AnyRecord]] = field(default_factory=list)  # (line number, record)
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
            f"{package_version()} reads v1..v{SCHEMA_VERSION}); upgrade gpumarket to read it"
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
            suffix = raw[-DIGEST_SUFFIX_LEN:]
            body = raw[:-DIGEST_SUFFIX_LEN] + b"}"
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
        model = RECORD_MODELS.get(kind) if isinstance(kind, str) else None
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


def read_progress(path: Path) -> dict[str, Any]:
    """Steps, round and phase so far of a transcript being written, read from its last step
    record (the last 64 KiB of the file; a live match's progress without reading it whole)."""
    out: dict[str, Any] = {"steps": 0, "round": 0, "phase": None}
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            lines = fh.read().splitlines()
    except OSError:
        return out
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("type") == "step":
            out.update(steps=int(rec["i"]) + 1, round=rec.get("round"), phase=rec.get("phase"))
            break
    return out
