"""LLM training data from transcripts: chat-format SFT records and an env-stepping GRPO reward.

**SFT export** (:func:`export_sft`, ``gpumarket export-sft``): one JSONL record per decision,
``{"messages": [...], "metadata": {...}}``.

- An LLM seat's decision is exactly what the model saw and said, from the step's recorded
  exchange: the recorded ``messages`` (system, user, and for a repaired decision the earlier
  reply and the repair request) followed by ``{"role": "assistant", "content": raw}``, the raw
  text of its last reply. A decision without a reply (a backend error) is not exported.
- With ``include_scripted`` a scripted seat's decision is rendered as the prompt an
  :class:`~agents.llm.agent.LLMAgent` in that seat would have been sent
  (:func:`agents.llm.agent.prompt_messages` on the observation, rebuilt by replaying the transcript and
  checked against the recorded observation digest), answered by the action it played as compact
  JSON (``None`` fields and ``agent`` left out). This is how a scripted expert is distilled into an
  LLM.
- A seat a person played (the ``human`` agent, ``gpumarket play``) is rendered the same way,
  always (no flag needed): a human game is SFT data. Its ``metadata["kind"]`` is ``human``.

A decision is *valid* when the reply parsed (no fallback) and the env accepted the action (no
``info.error``). Filters: seats, agent spec (a glob on the header's seat spec), phases, minimum
step reward, minimum episode return, valid only. Every filtered decision is counted with its
reason (:class:`ExportCounts`).

**GRPO** (:func:`grpo_records` / :func:`grpo_dataset`, :class:`~market.train.grpo.EnvReward`): a prompt dataset
whose rows locate the recorded state (``transcript`` path, ``step`` index, ``transcript_sha256``)
and a TRL reward function that scores each completion by stepping the real env from that state;
see :class:`market.train.grpo.EnvReward` for exactly what the reward is. Reading transcripts
and stepping an env through them is :mod:`market.train.replayer`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.llm.prompts import PROMPT_TOKEN_BUDGET, prompt_messages
from market.core.actions import ActionParseError, parse_action
from market.core.seats import DESIGNER
from market.record.transcript import (
    StepEvent,
    Transcript,
    TranscriptError,
    decode_action,
    decode_number,
    jsonable,
)
from market.train.replayer import Replayer, load_transcript, transcript_files

Messages = list[dict[str, str]]


def _is_llm_seat(t: Transcript, seat: str) -> bool:
    spec = t.header.seats.get(seat)
    return spec is not None and spec.kind == "llm"


def _is_human_seat(t: Transcript, seat: str) -> bool:
    """A seat a person played (the ``human`` agent: ``gpumarket play``)."""
    spec = t.header.seats.get(seat)
    return spec is not None and spec.name == "human"


# ---------------------------------------------------------------------------------------------
# SFT export
# ---------------------------------------------------------------------------------------------
@dataclass
class ExportFilter:
    """Which decisions to keep. ``agent`` is a glob on the header's seat spec (``llm*``,
    ``rule_expert``); ``min_reward`` applies to the step reward, ``min_return`` to the seat's
    episode return; ``valid_only`` keeps decisions whose reply parsed without fallback and whose
    action the env accepted; ``include_scripted`` also renders scripted seats' decisions.
    ``max_prompt_tokens`` is the prompt budget scripted decisions are rendered at
    (:func:`agents.llm.prompts.prompt_messages`): a seat trained on them must be sent prompts of
    the same budget, or it sees another (fuller or more cut) prompt than it learnt from."""

    seats: Sequence[str] | None = None
    agent: str | None = None
    phases: Sequence[str] | None = None
    min_reward: float | None = None
    min_return: float | None = None
    valid_only: bool = False
    include_scripted: bool = False
    max_prompt_tokens: int | None = PROMPT_TOKEN_BUDGET


@dataclass
class ExportCounts:
    """Decisions seen, exported, and filtered out by reason."""

    files: int = 0
    decisions: int = 0
    exported: int = 0
    filtered: Counter[str] = field(default_factory=Counter)

    def describe(self) -> str:
        out = f"{self.exported} decision(s) exported from {self.files} transcript(s)"
        n = sum(self.filtered.values())
        if n:
            why = ", ".join(f"{k} {v}" for k, v in sorted(self.filtered.items()))
            out += f"; {n} filtered out ({why})"
        return out


def _round_closers(t: Transcript) -> list[int]:
    return sorted(r.i for r in t.rounds)


def _returns(t: Transcript) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Per-step seat rewards, and each seat's episode return (the footer's; summed for a cut
    file)."""
    per_step = [{s: decode_number(v) for s, v in ev.rewards.items()} for ev in t.steps]
    if t.footer is not None and t.complete:
        totals = {s: decode_number(v) for s, v in t.footer.returns.items()}
    else:
        totals = {}
        for rewards in per_step:
            for s, v in rewards.items():
                totals[s] = totals.get(s, 0.0) + v
    return per_step, totals


def _action_reply(ev: StepEvent) -> tuple[str | None, str | None]:
    """A scripted step's action as the JSON reply an LLM would give, and its action_type."""
    if ev.action_kind in ("none", "opaque"):
        return None, None
    try:
        action = parse_action(
            decode_action(ev.action_kind, ev.action), designer=ev.seat == DESIGNER
        )
    except ActionParseError:
        return None, None
    data = action.model_dump(mode="json", exclude_none=True, exclude={"agent"})
    return json.dumps(data, separators=(",", ":")), action.action_type


def iter_decisions(
    t: Transcript,
    include_scripted: bool = False,
    max_prompt_tokens: int | None = PROMPT_TOKEN_BUDGET,
) -> Iterator[dict[str, Any]]:
    """Every live decision of a transcript as ``{"messages", "metadata"}`` (no filtering; a
    decision that cannot be rendered has ``messages`` None and ``metadata["skip"]`` saying why).

    Metadata: ``transcript``, ``seed``, ``scenario``, ``step``, ``seat``, ``agent`` (the seat's
    spec), ``kind`` (llm/scripted), ``model``, ``round``, ``phase``, ``action_type``, ``parsed``,
    ``fallback``, ``attempts``, ``env_error``, ``step_reward`` (the seat's reward paid by this
    step), ``round_return`` (its rewards from this step through the step that closed the round),
    ``episode_return``, ``partial`` (the file was cut: returns cover the complete steps only).
    Scripted and human decisions are rendered at ``max_prompt_tokens`` (see :class:`ExportFilter`).
    """

    def render(obs: Any) -> Messages:
        return prompt_messages(obs, max_tokens=max_prompt_tokens)

    per_step, totals = _returns(t)
    closers = _round_closers(t)
    humans = {s for s in t.header.seats if _is_human_seat(t, s)}
    replayer = Replayer(t) if include_scripted or humans else None
    closer_idx = 0
    for ev in t.steps:
        obs = live = None
        if replayer is not None:
            _, obs, live = replayer.observe()
        while closer_idx < len(closers) and closers[closer_idx] < ev.i:
            closer_idx += 1
        end = closers[closer_idx] if closer_idx < len(closers) else len(t.steps) - 1
        if ev.live:
            shown = obs if include_scripted or ev.seat in humans else None
            yield _decision(t, ev, shown, per_step, totals, end, render)
        if replayer is not None:
            replayer.advance()


def _decision(
    t: Transcript,
    ev: StepEvent,
    obs: Any,
    per_step: list[dict[str, float]],
    totals: dict[str, float],
    round_end: int,
    prompt_messages: Callable[[Any], Messages],
) -> dict[str, Any]:
    h, seat = t.header, ev.seat
    spec = h.seats.get(seat)
    is_llm = _is_llm_seat(t, seat)
    meta: dict[str, Any] = {
        "transcript": str(t.path) if t.path else None,
        "seed": h.seed,
        "scenario": h.scenario_name,
        "step": ev.i,
        "seat": seat,
        "agent": spec.spec if spec else None,
        "kind": "llm" if is_llm else "human" if _is_human_seat(t, seat) else "scripted",
        "model": spec.model if spec else None,
        "round": ev.round,
        "phase": ev.phase,
        "action_type": ev.info.action,
        "parsed": True,
        "fallback": False,
        "attempts": 0,
        "env_error": ev.info.error,
        "step_reward": per_step[ev.i].get(seat, 0.0),
        "round_return": sum(per_step[k].get(seat, 0.0) for k in range(ev.i, round_end + 1)),
        "episode_return": totals.get(seat, 0.0),
        "partial": not t.complete,
    }
    messages: Messages | None = None
    if is_llm:
        ex = ev.llm
        extra = (ex.model_extra or {}) if ex is not None else {}
        if ex is None or not ex.messages:
            meta["skip"] = "no_prompt"
        elif ex.raw is None:
            meta["skip"] = "no_reply"
        else:
            messages = [dict(m) for m in ex.messages]
            messages.append({"role": "assistant", "content": ex.raw})
            meta["fallback"] = bool(extra.get("fallback", False))
            meta["parsed"] = ex.error is None and not meta["fallback"]
            meta["attempts"] = int(extra.get("attempts", 1) or 1)
    elif obs is not None:
        reply, action_type = _action_reply(ev)
        if reply is None:
            meta["skip"] = "unparseable_action"
            meta["parsed"] = False
        else:
            messages = [*prompt_messages(obs), {"role": "assistant", "content": reply}]
            meta["action_type"] = meta["action_type"] or action_type
    else:
        meta["skip"] = "scripted"
    return {"messages": messages, "metadata": meta}


def _keep(rec: dict[str, Any], flt: ExportFilter) -> str | None:
    """None to keep the record, else the reason it is filtered out."""
    m = rec["metadata"]
    if flt.seats is not None and m["seat"] not in flt.seats:
        return "seat"
    if flt.agent is not None and not fnmatch.fnmatchcase(str(m["agent"]), flt.agent):
        return "agent"
    if flt.phases is not None and m["phase"] not in flt.phases:
        return "phase"
    if rec["messages"] is None:
        return str(m.get("skip", "unrenderable"))
    if flt.valid_only and not (m["parsed"] and not m["fallback"] and m["env_error"] is None):
        return "invalid"
    if flt.min_reward is not None and not m["step_reward"] >= flt.min_reward:
        return "min_reward"
    if flt.min_return is not None and not m["episode_return"] >= flt.min_return:
        return "min_return"
    return None


def _check_seats(transcripts: list[Transcript], seats: Sequence[str] | None) -> None:
    if not seats:
        return
    known = {s for t in transcripts for s in t.header.possible_agents}
    unknown = [s for s in seats if s not in known]
    if unknown:
        raise TranscriptError(
            f"unknown seat {unknown[0]!r}: the transcripts have seats {', '.join(sorted(known))}"
        )


def select_decisions(
    sources: Iterable[str | Path] | Iterable[Transcript],
    flt: ExportFilter | None = None,
    partial: bool = False,
    counts: ExportCounts | None = None,
) -> Iterator[dict[str, Any]]:
    """The decisions of transcripts (paths, folders or :class:`Transcript` objects) that pass
    ``flt``; ``counts`` is updated as they are read. Raises :class:`TranscriptError` (one line)
    for unusable input: a missing file, an edited or cut transcript (unless ``partial``), a seat
    that no transcript has, a replay that diverges."""
    flt = flt or ExportFilter()
    counts = counts if counts is not None else ExportCounts()
    items = list(sources)
    if all(isinstance(x, Transcript) for x in items):
        transcripts = [x for x in items if isinstance(x, Transcript)]
    else:
        transcripts = [
            load_transcript(f, partial)
            for f in transcript_files(x for x in items if not isinstance(x, Transcript))
        ]
    _check_seats(transcripts, flt.seats)
    for t in transcripts:
        counts.files += 1
        for rec in iter_decisions(t, flt.include_scripted, flt.max_prompt_tokens):
            counts.decisions += 1
            reason = _keep(rec, flt)
            if reason is not None:
                counts.filtered[reason] += 1
                continue
            counts.exported += 1
            rec["metadata"].pop("skip", None)
            yield rec


def export_sft(
    sources: Iterable[str | Path],
    out: str | Path,
    flt: ExportFilter | None = None,
    partial: bool = False,
) -> ExportCounts:
    """Write the selected decisions to ``out`` as JSONL (UTF-8, one record a line); see the
    module docstring for the record format. The file is written whole or not at all."""
    counts = ExportCounts()
    write_jsonl(out, list(select_decisions(sources, flt, partial, counts)))  # errors first
    return counts


def write_jsonl(out: str | Path, records: Sequence[Mapping[str, Any]]) -> Path:
    """``records`` as JSONL (UTF-8), written whole or not at all (a temp file, then a rename)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        for rec in records:
            fh.write(json.dumps(jsonable(rec), ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(out)
    return out


# ---------------------------------------------------------------------------------------------
# GRPO: prompt dataset
# ---------------------------------------------------------------------------------------------
def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def grpo_records(
    sources: Iterable[str | Path],
    flt: ExportFilter | None = None,
    partial: bool = False,
    counts: ExportCounts | None = None,
) -> list[dict[str, Any]]:
    """GRPO prompt rows, one per selected decision: ``prompt`` (the decision's first request:
    its system and user message, without repair turns), and the columns that locate the recorded
    state for :class:`EnvReward`: ``transcript`` (absolute path), ``step``,
    ``transcript_sha256``, plus ``seat``, ``phase``, ``round``, ``recorded_reward``
    (its step reward) and ``recorded_round_return``."""
    rows: list[dict[str, Any]] = []
    shas: dict[str, str] = {}
    for rec in select_decisions(sources, flt, partial, counts):
        m = rec["metadata"]
        path = str(Path(m["transcript"]).resolve())
        if path not in shas:
            shas[path] = _file_sha256(Path(path))
        prompt = [dict(x) for x in rec["messages"][:2]]
        rows.append(
            {
                "prompt": prompt,
                "transcript": path,
                "step": int(m["step"]),
                "transcript_sha256": shas[path],
                "seat": m["seat"],
                "phase": m["phase"],
                "round": int(m["round"]),
                "recorded_reward": float(m["step_reward"]),
                "recorded_round_return": float(m["round_return"]),
            }
        )
    return rows


def grpo_dataset(
    sources: Iterable[str | Path], flt: ExportFilter | None = None, partial: bool = False
) -> Any:
    """:func:`grpo_records` as a ``datasets.Dataset`` (needs the ``datasets`` package)."""
    try:
        from datasets import Dataset
    except ImportError:  # pragma: no cover - depends on the install
        raise ImportError(
            "grpo_dataset needs the 'datasets' package: pip install datasets"
        ) from None
    return Dataset.from_list(grpo_records(sources, flt, partial))


# ---------------------------------------------------------------------------------------------
# the `gpumarket export-sft` command
# ---------------------------------------------------------------------------------------------
def run_export_cli(args: Any) -> int:
    """``gpumarket export-sft``: 0 written, 2 unusable input (one line on stderr)."""
    flt = ExportFilter(
        seats=args.seat or None,
        agent=args.agent,
        phases=args.phase or None,
        min_reward=args.min_reward,
        min_return=args.min_return,
        valid_only=args.valid_only,
        include_scripted=args.include_scripted,
    )
    for name in ("min_reward", "min_return"):
        value = getattr(flt, name)
        if value is not None and not math.isfinite(value):
            print(
                f"gpumarket export-sft: --{name.replace('_', '-')} must be a finite number",
                file=sys.stderr,
            )
            return 2
    try:
        if args.grpo:  # the prompt dataset of EnvReward instead of SFT conversations
            counts = ExportCounts()
            write_jsonl(args.output, grpo_records(args.transcripts, flt, args.partial, counts))
        else:
            counts = export_sft(args.transcripts, args.output, flt, partial=args.partial)
    except (TranscriptError, ValueError, OSError) as exc:
        print(f"gpumarket export-sft: {exc}", file=sys.stderr)
        return 2
    print(f"{counts.describe()}; written to {args.output}")
    return 0
