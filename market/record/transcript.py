"""Episode transcripts: a JSONL schema, a crash-safe writer, a verifying reader and migrations.

This module is the front door: it re-exports the schema (:mod:`market.record.schema`), the writer
(:mod:`market.record.writer`) and the reader (:mod:`market.record.reader`), and is the command
``python -m market.record.transcript``.

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

import argparse
import sys
from pathlib import Path

from market.record.reader import (
    MIGRATIONS,
    NON_FINITE,
    Transcript,
    decode_action,
    decode_number,
    migrate,
    parse_transcript,
    read_transcript,
    records_of,
)
from market.record.schema import (
    GENESIS,
    SCHEMA_VERSION,
    ActionKind,
    AnyRecord,
    Footer,
    Header,
    LLMExchange,
    NonFinite,
    Num,
    Record,
    RoundSummary,
    SeatSpec,
    StepEvent,
    StepInfo,
    TranscriptError,
    json_schema,
    schema_text,
)
from market.record.writer import (
    EpisodeRecorder,
    TranscriptWriter,
    encode_action,
    jsonable,
    rewrite,
    seat_spec,
)

__all__ = [
    "ActionKind",
    "AnyRecord",
    "EpisodeRecorder",
    "Footer",
    "GENESIS",
    "Header",
    "LLMExchange",
    "MIGRATIONS",
    "NON_FINITE",
    "NonFinite",
    "Num",
    "Record",
    "RoundSummary",
    "SCHEMA_VERSION",
    "SeatSpec",
    "StepEvent",
    "StepInfo",
    "Transcript",
    "TranscriptError",
    "TranscriptWriter",
    "decode_action",
    "decode_number",
    "encode_action",
    "json_schema",
    "jsonable",
    "migrate",
    "parse_transcript",
    "read_transcript",
    "records_of",
    "rewrite",
    "schema_text",
    "seat_spec",
    "main",
]


def main(argv: list[str] | None = None) -> int:
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
