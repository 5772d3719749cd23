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

A decision is *valid* when the reply parsed (no fallback) and the env accepted the action (no
``info.error``). Filters: seats, agent spec (a glob on the header's seat spec), phases, minimum
step reward, minimum episode return, valid only. Every filtered decision is counted with its
reason (:class:`ExportCounts`).

**GRPO** (:func:`grpo_records` / :func:`grpo_dataset`, :class:`EnvReward`): a prompt dataset
whose rows locate the recorded state (``transcript`` path, ``step`` index, ``transcript_sha256``)
and a TRL reward function that scores each completion by stepping the real env from that state;
see :class:`EnvReward` for exactly what the reward is.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import hashlib
import json
import math
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from market.record.transcript import (
    StepEvent,
    Transcript,
    TranscriptError,
    decode_action,
    decode_number,
    jsonable,
    read_transcript,
)

Messages = list[dict[str, str]]
HORIZONS = ("step", "round", "episode", "steps:N", "rounds:N")


# ---------------------------------------------------------------------------------------------
# reading transcripts and stepping a fresh env through them
# ---------------------------------------------------------------------------------------------
def transcript_files(sources: Iterable[str | Path]) -> list[Path]:
    """Transcript files from files, folders of ``*.jsonl`` and run folders (as ``replay``).
    Raises :class:`TranscriptError` for a missing path or a folder without transcripts."""
    from market.record.replay import transcript_files

    files: list[Path] = []
    for src in sources:
        path = Path(src)
        if not path.exists():
            raise TranscriptError(f"{path}: no such file or folder")
        found = transcript_files([path])
        if not found:
            raise TranscriptError(f"{path}: no *.jsonl transcripts in this folder")
        files += found
    return files


def load_transcript(path: str | Path, partial: bool = False) -> Transcript:
    """Read and verify a transcript; a cut or aborted file is an error unless ``partial``."""
    t = read_transcript(path)
    if not t.complete and not partial:
        raise TranscriptError(
            f"{path}: {t.incomplete}; pass --partial to export the complete steps"
        )
    return t


def _is_llm_seat(t: Transcript, seat: str) -> bool:
    spec = t.header.seats.get(seat)
    return spec is not None and spec.kind == "llm"


class _Replayer:
    """A fresh env stepped through a transcript's recorded actions, by :mod:`market.record.replay`'s
    rules (the header's resolved scenario, the recorded seed, an LLM judge's recorded verdicts),
    checking the seat, round, phase, observation digest and state digest of every step."""

    def __init__(self, t: Transcript, env: Any = None, next_step: int = 0) -> None:
        from market.record.replay import rebuild_env

        self.t = t
        self.name = str(t.path or "transcript")
        self.next = next_step  # index of the next recorded step to play
        # continue from a restored env that is at step ``next_step``, or start afresh
        self.env = env if env is not None else rebuild_env(t)[0]

    def _diverged(self, ev: StepEvent, what: str, recorded: Any, live: Any) -> TranscriptError:
        return TranscriptError(
            f"{self.name}: step {ev.i} ({ev.seat}): the replay diverges from the recording "
            f"({what}: recorded {recorded!r}, replay {live!r}); check it with 'gpumarket replay'"
        )

    def observe(self) -> tuple[StepEvent, Any, bool]:
        """(the next recorded step, the observation its seat acts on, whether the seat is live)."""
        from market.record.replay import obs_digest

        ev, env = self.t.steps[self.next], self.env
        if not env.agents:
            raise self._diverged(ev, "seat", ev.seat, "<episode over>")
        for name, live_value in (("seat", env.agent_selection), ("round", env.round),
                                 ("phase", env.phase)):
            if getattr(ev, name) != live_value:
                raise self._diverged(ev, name, getattr(ev, name), live_value)
        obs, _, terminated, truncated, _ = env.last()
        live = not (terminated or truncated)
        if live and ev.obs_digest is not None and obs_digest(obs) != ev.obs_digest:
            raise self._diverged(ev, "obs_digest", ev.obs_digest, obs_digest(obs))
        return ev, obs, live

    def advance(self, agents: Mapping[str, Any] | None = None) -> None:
        """Play the next recorded step. ``agents`` (seat -> agent) are shown their seat's
        observation first (their choice is discarded), so stateful agents remember the episode."""
        ev, obs, live = self.observe()
        agent = (agents or {}).get(ev.seat)
        if live and agent is not None:
            with contextlib.suppress(Exception):  # a stand-in's bug must not stop the replay
                agent.act(obs)
        self.env.step(decode_action(ev.action_kind, ev.action))
        if ev.state_digest is not None and self.env.state_digest() != ev.state_digest:
            raise self._diverged(ev, "state_digest", ev.state_digest, self.env.state_digest())
        self.next += 1


# ---------------------------------------------------------------------------------------------
# SFT export
# ---------------------------------------------------------------------------------------------
@dataclass
class ExportFilter:
    """Which decisions to keep. ``agent`` is a glob on the header's seat spec (``llm*``,
    ``rule_expert``); ``min_reward`` applies to the step reward, ``min_return`` to the seat's
    episode return; ``valid_only`` keeps decisions whose reply parsed without fallback and whose
    action the env accepted; ``include_scripted`` also renders scripted seats' decisions."""

    seats: Sequence[str] | None = None
    agent: str | None = None
    phases: Sequence[str] | None = None
    min_reward: float | None = None
    min_return: float | None = None
    valid_only: bool = False
    include_scripted: bool = False


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
    from market.core.actions import ActionParseError, parse_action
    from market.environment.aec import DESIGNER

    if ev.action_kind in ("none", "opaque"):
        return None, None
    try:
        action = parse_action(decode_action(ev.action_kind, ev.action),
                              designer=ev.seat == DESIGNER)
    except ActionParseError:
        return None, None
    data = action.model_dump(mode="json", exclude_none=True, exclude={"agent"})
    return json.dumps(data, separators=(",", ":")), action.action_type


def iter_decisions(
    t: Transcript, include_scripted: bool = False
) -> Iterator[dict[str, Any]]:
    """Every live decision of a transcript as ``{"messages", "metadata"}`` (no filtering; a
    decision that cannot be rendered has ``messages`` None and ``metadata["skip"]`` saying why).

    Metadata: ``transcript``, ``seed``, ``scenario``, ``step``, ``seat``, ``agent`` (the seat's
    spec), ``kind`` (llm/scripted), ``model``, ``round``, ``phase``, ``action_type``, ``parsed``,
    ``fallback``, ``attempts``, ``env_error``, ``step_reward`` (the seat's reward paid by this
    step), ``round_return`` (its rewards from this step through the step that closed the round),
    ``episode_return``, ``partial`` (the file was cut: returns cover the complete steps only).
    """
    from agents.llm.agent import prompt_messages

    per_step, totals = _returns(t)
    closers = _round_closers(t)
    replayer = _Replayer(t) if include_scripted else None
    closer_idx = 0
    for ev in t.steps:
        obs = live = None
        if replayer is not None:
            _, obs, live = replayer.observe()
        while closer_idx < len(closers) and closers[closer_idx] < ev.i:
            closer_idx += 1
        end = closers[closer_idx] if closer_idx < len(closers) else len(t.steps) - 1
        if ev.live:
            yield _decision(t, ev, obs, per_step, totals, end, prompt_messages)
        if replayer is not None:
            replayer.advance()


def _decision(t: Transcript, ev: StepEvent, obs: Any, per_step: list[dict[str, float]],
              totals: dict[str, float], round_end: int,
              prompt_messages: Callable[[Any], Messages]) -> dict[str, Any]:
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
        "kind": "llm" if is_llm else "scripted",
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
        transcripts = [load_transcript(f, partial)
                       for f in transcript_files(x for x in items if not isinstance(x, Transcript))]
    _check_seats(transcripts, flt.seats)
    for t in transcripts:
        counts.files += 1
        for rec in iter_decisions(t, include_scripted=flt.include_scripted):
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
        rows.append({
            "prompt": prompt,
            "transcript": path,
            "step": int(m["step"]),
            "transcript_sha256": shas[path],
            "seat": m["seat"],
            "phase": m["phase"],
            "round": int(m["round"]),
            "recorded_reward": float(m["step_reward"]),
            "recorded_round_return": float(m["round_return"]),
        })
    return rows


def grpo_dataset(
    sources: Iterable[str | Path], flt: ExportFilter | None = None, partial: bool = False
) -> Any:
    """:func:`grpo_records` as a ``datasets.Dataset`` (needs the ``datasets`` package)."""
    try:
        from datasets import Dataset
    except ImportError:  # pragma: no cover - depends on the install
        raise ImportError("grpo_dataset needs the 'datasets' package: pip install datasets") from None
    return Dataset.from_list(grpo_records(sources, flt, partial))


# ---------------------------------------------------------------------------------------------
# GRPO: the reward function
# ---------------------------------------------------------------------------------------------
def parse_horizon(horizon: str | int) -> tuple[str, int]:
    """``"step"``, ``"round"``, ``"episode"``, ``"steps:N"``, ``"rounds:N"`` (or an int N,
    meaning ``steps:N``) -> (kind, n)."""
    if isinstance(horizon, int) and not isinstance(horizon, bool):
        kind, n = "steps", horizon
    else:
        text = str(horizon).strip()
        head, _, tail = text.partition(":")
        if text in ("step", "round", "episode"):
            return {"step": ("steps", 1), "round": ("rounds", 1), "episode": ("episode", 0)}[text]
        if head not in ("steps", "rounds") or not tail.strip().isdigit():
            raise ValueError(f"horizon {horizon!r}: use one of {', '.join(HORIZONS)}")
        kind, n = head, int(tail)
    if n < 1:
        raise ValueError(f"horizon {horizon!r}: N must be at least 1")
    return kind, n


@dataclass
class RewardDetail:
    """One completion's score and how it came about."""

    reward: float  # env_return - penalty
    env_return: float  # the seat's summed env reward over the horizon
    penalty: float  # parse_failure_penalty when the completion was unusable, else 0
    action: dict[str, Any]  # the action the env was stepped with
    parse_error: str | None  # why the completion was unusable (the fallback was played)
    env_error: str | None  # the env rejected the action (its invalid-action penalty is in env_return)
    steps: int  # env steps taken, the decision included


@dataclass
class _Snapshot:
    """The env and the continuation agents just before recorded step ``step``."""

    env: Any
    agents: dict[str, Any]
    step: int


class _NoBackend:
    """The parser agent never calls a model."""

    model = "none"


class EnvReward:
    """A TRL reward function (``reward_func(prompts, completions, **kwargs) -> list[float]``)
    that scores a completion by stepping the real env from the recorded state.

    For each completion, with the row's ``transcript`` and ``step`` (dataset columns, which TRL
    passes as keyword lists):

    1. **Restore**: the env is rebuilt from the transcript (resolved scenario, recorded seed, an
       LLM judge's recorded verdicts) and the recorded actions of steps ``0 .. step-1`` are
       replayed, checking every state digest; the seat of ``step`` is now to act.
    2. **Parse**: the completion (a string, or a message list whose last message's content is
       used) goes through :meth:`agents.llm.agent.LLMAgent.parse_reply`, exactly as that seat's LLM agent
       parses a reply (lenient JSON extraction, action validation, legal type, own seat). An
       unusable completion plays the agent's fallback action (its recorded ``fallback=``
       parameter; ``safe``: ``wait``, or an empty bid when bidding) and costs
       ``parse_failure_penalty`` (default: the scenario's ``invalid_action_penalty``, the env's
       charge for an invalid action). There is one attempt: no repair re-ask.
    3. **Step and continue**: the env is stepped with that action, then play continues to the
       ``horizon``: ``"round"`` (default: through the step that closes the decision's round),
       ``"step"`` (the decision only), ``"rounds:N"``, ``"steps:N"`` (N env steps, the decision
       included) or ``"episode"``. Other seats are played by their recorded agent spec when it was
       a rebuildable scripted spec; LLM seats (and agent objects) by ``stand_in`` (a spec, a
       ``{seat: spec}`` map, or None: the scenario's default agent for that seat). The seat under
       training continues with ``continuation`` (a spec; None: the same rule as other seats).
       Every agent is built fresh, reset with the seat's seed and shown the recorded prefix
       (its seat's observations, its own choices discarded), so stateful agents remember it.
    4. **Score**: the seat's summed env reward over the horizon (``env.rewards[seat]`` after every
       step, exactly the rewards a transcript records: job value, payments, trades, penalties,
       the invalid-action penalty if the env rejected the action), minus the parse-failure
       penalty. No proxy term.

    Determinism: the env's streams come from the recorded seed (common random numbers across
    completions), agents from their seat seeds, so the same completion always gets the same
    reward. Replayed prefixes are cached: a snapshot of the env and agents at each scored step
    (an LRU of ``cache_size``; 0 disables it) is deep-copied per completion, and a later step of
    the same transcript continues from the nearest earlier snapshot.
    """

    def __init__(
        self,
        horizon: str | int = "round",
        *,
        continuation: str | None = None,
        stand_in: str | Mapping[str, str] | None = None,
        parse_failure_penalty: float | None = None,
        cache_size: int = 256,
        check_sha256: bool = True,
    ) -> None:
        self.horizon = parse_horizon(horizon)
        self.continuation = continuation
        self.stand_in = stand_in
        self.parse_failure_penalty = parse_failure_penalty
        self.cache_size = int(cache_size)
        self.check_sha256 = check_sha256
        self.__name__ = "gpumarket_env_reward"  # TRL names the reward column after it
        self._transcripts: dict[str, tuple[tuple[int, int], Transcript, str]] = {}
        self._snapshots: OrderedDict[tuple[str, str | None, int], _Snapshot] = OrderedDict()
        self.stats: Counter[str] = Counter()

    # --- TRL entry point ------------------------------------------------------------------
    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        transcript: Sequence[str] | None = None,
        step: Sequence[int] | None = None,
        transcript_sha256: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        if transcript is None or step is None:
            raise ValueError(
                "EnvReward needs the dataset columns 'transcript' and 'step' "
                "(build the dataset with market.train.training_data.grpo_dataset)"
            )
        details = [
            self.score(transcript[k], int(step[k]), completions[k],
                       None if transcript_sha256 is None else transcript_sha256[k])
            for k in range(len(completions))
        ]
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and details:
            log_metric("gpumarket/parse_failure_rate",
                       sum(d.parse_error is not None for d in details) / len(details))
        return [d.reward for d in details]

    # --- one completion -------------------------------------------------------------------
    def score(self, transcript: str | Path, step: int, completion: Any,
              sha256: str | None = None) -> RewardDetail:
        """Score one completion at ``step`` of ``transcript`` (see the class docstring)."""
        from agents.llm.agent import LLMAgent
        from market.core.actions import ActionParseError

        t, path = self._transcript(transcript, sha256)
        if not 0 <= step < len(t.steps):
            raise ValueError(f"{path}: step {step} is out of range (0..{len(t.steps) - 1})")
        ev = t.steps[step]
        if not ev.live:
            raise ValueError(f"{path}: step {step} is a finished seat's step, not a decision")
        seat = ev.seat
        snap = self._snapshot(path, t, step)
        env, agents = copy.deepcopy((snap.env, snap.agents))
        obs = env.observe(seat)
        parser = LLMAgent(_NoBackend(), fallback=self._fallback_kind(t, seat))  # type: ignore[arg-type]
        text = _completion_text(completion)
        parse_error: str | None = None
        try:
            action = parser.parse_reply(text, obs)
        except ActionParseError as exc:
            parse_error = str(exc)
            action = parser.fallback_action(obs)
        penalty = 0.0
        if parse_error is not None:
            penalty = (env.scenario.rewards.invalid_action_penalty
                       if self.parse_failure_penalty is None else self.parse_failure_penalty)
        env_return, steps, env_error = self._play(env, agents, seat, action)
        self.stats["scored"] += 1
        return RewardDetail(
            reward=env_return - penalty, env_return=env_return, penalty=penalty,
            action=action.model_dump(mode="json", exclude_none=True), parse_error=parse_error,
            env_error=env_error, steps=steps,
        )

    def _play(self, env: Any, agents: dict[str, Any], seat: str,
              action: Any) -> tuple[float, int, str | None]:
        from market.run.rollout import fallback_action

        kind, n = self.horizon
        rounds_before = len(env.round_log)
        env.step(action)
        env_error = env.infos.get(seat, {}).get("error")
        total, steps = float(env.rewards.get(seat, 0.0)), 1
        while env.agents:
            if kind == "steps" and steps >= n:
                break
            if kind == "rounds" and len(env.round_log) >= rounds_before + n:
                break
            current = env.agent_selection
            obs, _, terminated, truncated, _ = env.last()
            act = None
            if not (terminated or truncated):
                try:
                    act = agents[current].act(obs)
                except Exception:  # as the runner: a failing agent plays the safe fallback
                    act = fallback_action(obs)
            env.step(act)
            total += float(env.rewards.get(seat, 0.0))
            steps += 1
        return total, steps, env_error

    # --- restoring recorded states --------------------------------------------------------
    def _transcript(self, source: str | Path, sha256: str | None) -> tuple[Transcript, str]:
        path = Path(source).resolve()
        key = str(path)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise TranscriptError(f"{path}: no such file") from None
        stamp = (st.st_mtime_ns, st.st_size)
        cached = self._transcripts.get(key)
        if cached is None or cached[0] != stamp:
            data = path.read_bytes()
            from market.record.transcript import parse_transcript

            t = parse_transcript(data, name=key, path=path)
            cached = (stamp, t, hashlib.sha256(data).hexdigest())
            self._transcripts[key] = cached
            for k in [k for k in self._snapshots if k[0] == key]:  # the file changed
                del self._snapshots[k]
        if self.check_sha256 and sha256 and sha256 != cached[2]:
            raise TranscriptError(
                f"{path}: the file changed since the dataset was built (sha256 differs); "
                "rebuild the dataset"
            )
        return cached[1], key

    def _fallback_kind(self, t: Transcript, seat: str) -> str:
        spec = t.header.seats.get(seat)
        if spec is not None and spec.kind == "llm":
            fallback = dict(parse_qsl(spec.spec.partition("?")[2])).get("fallback", "safe")
            if fallback in ("safe", "truthful"):
                return fallback
        return "safe"

    def seat_specs(self, t: Transcript, trained: str) -> dict[str, str]:
        """The spec that plays each seat after the decision (see the class docstring)."""
        from market.record.replay import scenario_of
        from market.run.rollout import default_seats

        defaults = default_seats(scenario_of(t))
        specs: dict[str, str] = {}
        for seat, spec in t.header.seats.items():
            if seat == trained and self.continuation is not None:
                specs[seat] = self.continuation
            elif spec.kind == "scripted" and spec.rebuildable:
                specs[seat] = spec.spec
            else:
                if isinstance(self.stand_in, str):
                    chosen: str | None = self.stand_in
                elif isinstance(self.stand_in, Mapping):
                    chosen = self.stand_in.get(seat)
                else:
                    chosen = None
                chosen = chosen or defaults.get(seat)
                if chosen is None or chosen.startswith("llm"):
                    raise ValueError(
                        f"{seat} was played by {spec.spec!r} and the scenario's default for it is "
                        f"{chosen!r}: pass stand_in='SPEC' (a scripted agent) to play it"
                    )
                specs[seat] = chosen
        return specs

    def _agents(self, t: Transcript, trained: str, env: Any) -> dict[str, Any]:
        from agents.registry import make_agent
        from market.environment.aec import DESIGNER

        agents: dict[str, Any] = {}
        for seat, spec in self.seat_specs(t, trained).items():
            try:
                agents[seat] = make_agent(spec, "designer" if seat == DESIGNER else "bidder")
            except Exception as exc:
                raise ValueError(f"{seat}: cannot build agent {spec!r}: {exc}") from None
            agents[seat].reset(env.seat_seed(seat))
        return agents

    def _snapshot(self, path: str, t: Transcript, step: int) -> _Snapshot:
        """The env and agents just before ``step`` (cached; see the class docstring)."""
        trained = t.steps[step].seat if self.continuation is not None else None
        key = (path, trained, step)
        snap = self._snapshots.get(key)
        if snap is not None:
            self._snapshots.move_to_end(key)
            self.stats["cache_hits"] += 1
            return snap
        self.stats["cache_misses"] += 1
        base = max((k for k in self._snapshots if k[:2] == key[:2] and k[2] <= step),
                   key=lambda k: k[2], default=None)
        if base is not None:  # continue a copy of the nearest earlier snapshot
            env, agents = copy.deepcopy((self._snapshots[base].env, self._snapshots[base].agents))
            replayer = _Replayer(t, env=env, next_step=base[2])
        else:
            replayer = _Replayer(t)
            agents = self._agents(t, t.steps[step].seat, replayer.env)
        while replayer.next < step:
            replayer.advance(agents)
            self.stats["replayed_steps"] += 1
        replayer.observe()  # the decision's seat, round, phase and observation digest match
        snap = _Snapshot(replayer.env, agents, step)
        if self.cache_size > 0:
            self._snapshots[key] = snap
            while len(self._snapshots) > self.cache_size:
                self._snapshots.popitem(last=False)
        return snap


def _completion_text(completion: Any) -> str:
    """A TRL completion as text: a string, or a list of chat messages (the last one's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence) and completion:
        last = completion[-1]
        if isinstance(last, Mapping):
            content = last.get("content")
            if isinstance(content, list):  # multimodal parts: join the text parts
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            return str(content or "")
        return str(last)
    return ""


def reward_rate(reward: EnvReward, rows: Sequence[Mapping[str, Any]], completions: Sequence[str],
                seconds: float = 2.0) -> float:
    """Reward-function calls per second over ``rows`` x ``completions`` (a benchmark)."""
    calls, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        for row in rows:
            for c in completions:
                reward.score(row["transcript"], int(row["step"]), c)
                calls += 1
    return calls / (time.perf_counter() - began)


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
            print(f"gpumarket export-sft: --{name.replace('_', '-')} must be a finite number",
                  file=sys.stderr)
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
