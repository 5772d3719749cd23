"""Replay a transcript: re-execute its recorded actions and verify the episode bit for bit.

A fresh :class:`~market.environment.aec.raw_env` is built from the header's fully resolved scenario
and reset with its seed; every recorded action (for LLM seats, the action the env received from
the recorded model output, so no model or network is needed) is fed back in order. After each
step the replay compares, exactly (floats by ``repr``): the seat and phase, the env's ``info``
(action, result, error), every seat's reward and reward components, the state digest, and each
round summary; at the end the footer's totals. The first difference is reported with its step,
seat, line and field.

``rejudge`` replays the same way while asking a second judge to score every round's pitches on the
identical state, and reports how the verdicts would change (the episode itself is not altered).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from agents.registry import AgentSpecError
from agents.spec_policy import SpecPolicy
from market.core import settlement
from market.core.judge import JudgeHistory
from market.core.judge_specs import make_judge
from market.core.scenario_schema import RUN_ONLY_KEYS, Scenario
from market.core.seats import bidder_seat
from market.environment.aec import raw_env
from market.environment.conduct_log import ConductLog
from market.environment.observations import digest_json
from market.record.reader import (
    Transcript,
    decode_action,
    read_transcript,
)
from market.record.recorded import (
    ConductRejudge,
    RecordedJudge,
    RecordedReader,
    make_reader,
    recorded_scores,
)
from market.record.schema import Footer, RoundSummary, StepEvent, TranscriptError
from market.record.writer import first_difference, jsonable
from market.run.rollout import Tally, run_episode
from scenarios import builtin_names, load_scenario


@dataclass
class Mismatch:
    """The first place where the replay differs from the recording."""

    step: int | None
    line: int
    seat: str | None
    field: str
    expected: Any
    actual: Any

    def describe(self) -> str:
        where = f"step {self.step}" if self.step is not None else "end of episode"
        who = f" ({self.seat})" if self.seat else ""

        def short(v: Any) -> str:
            text = repr(v)
            return text if len(text) <= 160 else text[:157] + "..."

        return (
            f"{where}{who}, line {self.line}: field '{self.field}' differs: "
            f"recorded {short(self.expected)}, replay gives {short(self.actual)}"
        )


@dataclass
class ReplayReport:
    path: str | None
    scenario: str
    seed: int
    steps_recorded: int
    steps_checked: int = 0
    rounds_checked: int = 0
    digests_checked: int = 0
    partial: bool = False
    mismatch: Mismatch | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    round_log: list[dict[str, Any]] = field(default_factory=list)
    conduct_scores: dict[str, dict[str, Any]] = field(default_factory=dict)  # the replay's

    @property
    def ok(self) -> bool:
        return self.mismatch is None

    def describe(self) -> str:
        head = f"{self.path or 'transcript'}: {self.scenario} seed {self.seed}: "
        if self.mismatch is not None:
            return head + f"REPLAY DIVERGES at {self.mismatch.describe()}"
        scope = "partial replay of the complete steps" if self.partial else "replay exact"
        return head + (
            f"{scope}: {self.steps_checked} steps, {self.rounds_checked} round summaries, "
            f"{self.digests_checked} state digests verified ({self.seconds:.2f}s)"
        )


def scenario_of(t: Transcript) -> Scenario:
    """The recorded resolved scenario, validated; a :class:`TranscriptError` when this
    gpumarket no longer accepts it."""
    try:
        return Scenario.model_validate(t.header.scenario)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise TranscriptError(
            f"the recorded scenario is not valid for this gpumarket (key '{loc}': "
            f"{err['msg']}); it was recorded by gpumarket {t.header.package_version}"
        ) from None


def obs_digest(obs: Any) -> str:
    """The 16-hex SHA-256 digest of an observation, as the recorder writes ``obs_digest``."""
    # feedback fields (the last action's verdict) are left out: observations.FEEDBACK_FIELDS
    data = digest_json(obs) if isinstance(obs, BaseModel) else repr(obs).encode("utf-8", "replace")
    return hashlib.sha256(data).hexdigest()[:16]


def rebuild_env(t: Transcript) -> tuple[Any, bool]:
    """A fresh env reset to the recorded episode's start: the header's resolved scenario and seed.
    An LLM judge is replaced by its recorded verdicts (no model is called); the flag says so."""
    h = t.header
    scenario = scenario_of(t)
    recorded_judge = not str(getattr(scenario, "judge", "rule")).startswith("rule")
    if recorded_judge:
        scenario = scenario.model_copy(update={"judge": "rule"})
    recorded_reader = scenario.conduct_judge != "rule"
    if recorded_reader:  # a model's readings are played back, as a model judge's verdicts
        scenario = scenario.model_copy(update={"conduct_judge": "rule"})
    try:
        env = raw_env(scenario)
        env.reset(seed=h.seed)
    except Exception as exc:  # e.g. a seed this gpumarket cannot use
        raise TranscriptError(
            f"{t.path or 'transcript'}: cannot rebuild the recorded episode (scenario "
            f"{h.scenario_name!r}, seed {h.seed}): {type(exc).__name__}: {exc}"
        ) from None
    if recorded_judge:
        env.judge = RecordedJudge(t.rounds)
    if recorded_reader:
        env.conduct.reader = RecordedReader(t)
    return env, recorded_judge


def _load(source: Transcript | str | Path, partial: bool, verify: bool) -> Transcript:
    t = source if isinstance(source, Transcript) else read_transcript(source, verify=verify)
    if not t.complete and not partial:
        raise TranscriptError(
            f"{t.path or 'transcript'}: {t.incomplete}; pass --partial to replay the complete steps"
        )
    return t


def replay(
    source: Transcript | str | Path,
    *,
    partial: bool = False,
    verify: bool = True,
    check_observations: bool = True,
    on_round: Callable[[Any, RoundSummary], None] | None = None,
    conduct_reader: Any = None,
) -> ReplayReport:
    """Replay a transcript and verify it (see the module docstring).

    Raises :class:`~market.record.transcript.TranscriptError` when the file cannot be used (unreadable,
    edited, newer schema, or incomplete without ``partial``); a divergence is not an exception
    but ``report.mismatch``.
    """
    began = time.perf_counter()
    t = _load(source, partial, verify)
    h = t.header
    env, recorded_judge = rebuild_env(t)
    report = ReplayReport(
        path=str(t.path) if t.path else None,
        scenario=h.scenario_name,
        seed=h.seed,
        steps_recorded=len(t.steps),
        partial=not t.complete,
        notes=list(t.notes),
    )
    if t.incomplete:
        report.notes.append(t.incomplete)
    if recorded_judge:
        report.notes.append(
            f"judge {h.judge}: its recorded verdicts were replayed (no model called)"
        )
    # transcripts recorded before the conduct judge carry no verdicts to compare; another
    # reader (rejudging) gives other verdicts
    judged = h.conduct_judge is not None and conduct_reader is None
    if conduct_reader is not None:
        # the market's audit keeps reading the recorded readings, so the market replays exactly
        env.conduct.market = ConductLog(env.conduct.reader)
        env.conduct.reader = conduct_reader
    tally = Tally()
    obs_cache: dict[str, tuple[Any, str]] = {}
    rounds = 0

    def fail(
        line: int, ev: StepEvent | None, name: str, expected: Any, actual: Any
    ) -> ReplayReport:
        report.mismatch = Mismatch(
            ev.i if ev else None, line, ev.seat if ev else None, name, expected, actual
        )
        report.seconds = time.perf_counter() - began
        report.round_log = env.round_log
        return report

    for line, rec in t.records[1:]:
        if isinstance(rec, StepEvent):
            ev = rec
            if not env.agents:
                return fail(line, ev, "seat", ev.seat, "<episode already over>")
            seat = env.agent_selection
            for name, live_value in (("seat", seat), ("round", env.round), ("phase", env.phase)):
                if getattr(ev, name) != live_value:
                    return fail(line, ev, name, getattr(ev, name), live_value)
            obs, reward, terminated, truncated, info = env.last()
            tally.observe(seat, reward, info)
            live = not (terminated or truncated)
            if live != ev.live:
                return fail(line, ev, "live", ev.live, live)
            if check_observations and live and ev.obs_digest is not None:
                cached = obs_cache.get(seat)
                digest = cached[1] if cached is not None and cached[0] is obs else obs_digest(obs)
                obs_cache[seat] = (obs, digest)
                if digest != ev.obs_digest:
                    return fail(line, ev, "obs_digest", ev.obs_digest, digest)
            try:
                env.step(decode_action(ev.action_kind, ev.action))
            except Exception as exc:  # the env must never raise on an action: report it
                return fail(line, ev, "env.step", "no exception", f"{type(exc).__name__}: {exc}")
            tally.steps += 1
            got = env.infos.get(seat, {}) if live else {}
            recorded_info = ev.info.model_dump(exclude_none=True)
            live_info = {k: jsonable(got[k]) for k in ("action", "result", "error") if k in got}
            if ev.action_kind == "opaque":  # only *that* it failed can be checked
                if "error" not in live_info:
                    return fail(line, ev, "info.error", recorded_info.get("error"), None)
                live_info["error"] = recorded_info.get("error")
            diff = first_difference(recorded_info, live_info, "info")
            if diff is not None:
                return fail(line, ev, *diff)
            rewards = {a: r for a, r in env.rewards.items() if r != 0.0}
            diff = first_difference(ev.rewards, jsonable(rewards), "rewards")
            if diff is not None:
                return fail(line, ev, *diff)
            components = {
                a: jsonable(env.infos.get(a, {}).get("reward_components", {})) for a in rewards
            }
            diff = first_difference(ev.components, components, "components")
            if diff is not None:
                return fail(line, ev, *diff)
            if judged:
                diff = first_difference(
                    ev.conduct or [], jsonable(env.conduct.step_entries), "conduct"
                )
                if diff is not None:
                    return fail(line, ev, *diff)
            if ev.state_digest is not None:
                digest = env.state_digest()
                if digest != ev.state_digest:
                    return fail(line, ev, "state_digest", ev.state_digest, digest)
                report.digests_checked += 1
            report.steps_checked += 1
        elif isinstance(rec, RoundSummary):
            step_ev = t.steps[rec.i] if 0 <= rec.i < len(t.steps) else None
            if rounds >= len(env.round_log):
                return fail(
                    line, step_ev, f"round_summary[{rec.round}]", rec.summary, "<round not closed>"
                )
            diff = first_difference(
                rec.summary, jsonable(env.round_log[rounds]), f"round_summary[{rec.round}]"
            )
            if diff is not None:
                return fail(line, step_ev, *diff)
            if judged:
                diff = first_difference(
                    rec.conduct, jsonable(env.conduct.rounds[rounds]), f"conduct[{rec.round}]"
                )
                if diff is not None:
                    return fail(line, step_ev, *diff)
            if on_round is not None:
                on_round(env, rec)
            rounds += 1
            report.rounds_checked += 1
        elif isinstance(rec, Footer) and rec.status == "complete":
            if env.agents:
                return fail(
                    line,
                    None,
                    "footer.steps",
                    rec.steps,
                    f"more steps: seats {env.agents} still to play",
                )
            if rounds != len(env.round_log):
                return fail(line, None, "footer.rounds", rounds, len(env.round_log))
            if rec.steps != tally.steps:
                return fail(line, None, "footer.steps", rec.steps, tally.steps)
            returns = {s: tally.returns.get(s, 0.0) for s in t.header.seats}
            diff = first_difference(rec.returns, jsonable(returns), "footer.returns")
            if diff is not None:
                return fail(line, None, *diff)
            invalid = {s: tally.invalid.get(s, 0) for s in t.header.seats}
            diff = first_difference(rec.invalid_actions, invalid, "footer.invalid_actions")
            if diff is not None:
                return fail(line, None, *diff)
            if judged and rec.conduct is not None:
                scores = jsonable(env.conduct.score_dicts())
                diff = first_difference(rec.conduct, scores, "footer.conduct")
                if diff is not None:
                    return fail(line, None, *diff)
    report.seconds = time.perf_counter() - began
    report.round_log = env.round_log
    report.conduct_scores = env.conduct.score_dicts()
    return report


# ---------------------------------------------------------------------------------------------
# re-recording (golden files) and re-judging
# ---------------------------------------------------------------------------------------------
def rerecord(
    path: str | Path,
    out: str | Path | None = None,
    seats: Mapping[str, str] | None = None,
) -> tuple[Path, Any]:
    """Record the transcript's episode afresh (same seed) over ``out`` (default: in place). A
    built-in scenario is taken from the current built-in file, so ``replay --update`` also picks
    up deliberate scenario changes; other scenarios from the recorded header.

    A transcript is data, not code: the agents are the ones the user names in ``seats`` (seat ->
    spec). A seat not named there is rebuilt from its recorded spec only when that spec is a
    built-in agent that loads no code, file or URL (:class:`agents.spec_policy.SpecPolicy`'s
    default); any other recorded spec (``py:``, plug-ins, ``torch_policy``, ``remote``, LLM
    seats) is refused with the flag that names it. Returns (path, EpisodeResult)."""
    path = Path(path)
    t = read_transcript(path, verify=False)
    h = t.header
    given = dict(seats or {})
    unknown = sorted(set(given) - set(h.seats))
    if unknown:
        raise TranscriptError(
            f"{path}: --seat names {', '.join(unknown)}, not seats of this episode "
            f"({', '.join(h.seats)})"
        )
    bad = [s for s, spec in h.seats.items() if s not in given and not spec.rebuildable]
    if bad:
        raise TranscriptError(
            f"{path}: seats {', '.join(bad)} have no spec to rebuild (agent objects, or specs "
            "recorded with their secrets masked): name their agents with --seat SEAT=SPEC to "
            "re-record this episode"
        )
    specs: dict[str, str] = {}
    for seat, recorded in h.seats.items():
        if seat in given:
            specs[seat] = given[seat]
            continue
        try:
            SpecPolicy().check(recorded.spec)
        except AgentSpecError:
            raise TranscriptError(
                f"{path}: seat {seat} was recorded as {recorded.spec!r}, which is not "
                "a built-in agent; the specs in a file are never run: name its agent with "
                f"--seat {seat}=SPEC to re-record this episode"
            ) from None
        specs[seat] = recorded.spec
    if any(spec.startswith("llm:") for spec in specs.values()):
        raise TranscriptError(
            f"{path}: has LLM seats; re-recording would query the models again "
            "(record it with 'gpumarket run' instead)"
        )
    scenario = (
        load_scenario(h.scenario_name) if h.scenario_name in builtin_names() else scenario_of(t)
    )
    if not str(scenario.judge).startswith("rule") or scenario.conduct_judge != "rule":
        raise TranscriptError(
            f"{path}: its scenario has an LLM judge; re-recording would query the model again "
            "(record it with 'gpumarket run' instead)"
        )
    target = Path(out) if out is not None else path
    tmp = target.with_name(target.name + ".new.jsonl")
    try:
        result = run_episode(
            scenario,
            h.seed,
            specs,
            transcript=tmp,
            digest_every=h.digest_every,
        )
    except ValueError as exc:  # an agent spec or scenario this gpumarket no longer knows
        tmp.unlink(missing_ok=True)
        raise TranscriptError(f"{path}: cannot re-record: {exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(target)
    result.transcript = str(target)
    return target, result


def builtin_drift(t: Transcript) -> str | None:
    """If the transcript's scenario is a built-in whose current file differs from the recorded
    resolved scenario, a message naming the first differing key; else None."""
    name = t.header.scenario_name
    if name not in builtin_names():
        return None
    current = jsonable(load_scenario(name).model_dump(mode="json", exclude=set(RUN_ONLY_KEYS)))
    # keys such as agent_timeout say how the episode was run, not what it is
    recorded = {k: v for k, v in t.header.scenario.items() if k not in RUN_ONLY_KEYS}
    diff = first_difference(recorded, current, "scenario")
    if diff is None:
        return None
    return (
        f"built-in scenario {name!r} changed since this transcript was recorded ({diff[0]}: "
        f"recorded {diff[1]!r}, now {diff[2]!r}); re-record with 'gpumarket replay --update'"
    )


def load_judge(spec: str) -> Any:
    """A judge object (with ``score(pitch, lab, context)``): any spec
    :func:`market.core.judge_specs.make_judge` accepts (``rule``, ``llm:openai?model=...``), or
    ``py:module:attr`` naming a judge object, class or zero-argument factory."""
    if spec.startswith("py:"):
        module, _, attr = spec[3:].partition(":")
        try:
            obj: Any = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise TranscriptError(
                f"--rejudge {spec}: cannot import: {exc} (is it installed or on PYTHONPATH?)"
            ) from None
        if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "score")):
            obj = obj()
    else:
        try:
            obj = make_judge(spec)
        except Exception as exc:
            raise TranscriptError(f"--rejudge {spec}: {exc}") from None
    if not callable(getattr(obj, "score", None)):
        raise TranscriptError(f"--rejudge {spec}: {obj!r} has no score(pitch, lab, context) method")
    return obj


@contextlib.contextmanager
def _shadow_judge(other: Any, sink: list[tuple[list[Any], Any]]) -> Iterator[None]:
    """Each time the market allocates the judge pool, also allocates it with ``other`` (and its
    own committee record) on the identical state; the market keeps the original verdicts.
    Collects (original verdicts, other's verdicts or the exception it raised)."""
    # settlement re-exports allocate_judge_pool for this patch
    original = settlement.allocate_judge_pool
    signature = inspect.signature(original)
    if not {"judge", "history"} <= set(signature.parameters):
        raise TranscriptError(
            "--rejudge: this gpumarket's allocate_judge_pool takes no judge/history"
        )
    history = JudgeHistory()

    def both(*args: Any, **kwargs: Any) -> Any:
        verdicts = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.arguments["judge"], bound.arguments["history"] = other, history
        try:
            alt: Any = original(*bound.args, **bound.kwargs)
        except Exception as exc:  # a failing judge is reported, never fatal
            alt = exc
        sink.append((list(verdicts), alt))
        return verdicts

    settlement.allocate_judge_pool = both
    try:
        yield
    finally:
        settlement.allocate_judge_pool = original


@dataclass
class RejudgeReport:
    replay: ReplayReport
    judge: str
    rounds: list[dict[str, Any]]  # per judged round: lab -> (old, new) score and grant
    conduct: ConductRejudge | None = None  # each seat's conduct scores, recorded and new

    @property
    def changed(self) -> int:
        return sum(
            1 for r in self.rounds for v in r["verdicts"] if v["granted"][0] != v["granted"][1]
        )


def rejudge(source: Transcript | str | Path, spec: str, *, partial: bool = False) -> RejudgeReport:
    """Replay ``source`` exactly while judging every round's pitches again with ``spec``."""
    other = load_judge(spec)
    calls: list[tuple[list[Any], Any]] = []
    per_round: list[dict[str, Any]] = []

    def on_round(env: Any, rec: RoundSummary) -> None:
        if not calls:
            return
        old, new = calls[-1]
        calls.clear()
        if isinstance(new, Exception):
            error = f"{type(new).__name__}: {new}"
            per_round.append({"round": rec.round, "error": error, "verdicts": []})
            return
        new_by_lab = {v.lab: v for v in new}
        rows = []
        for v in sorted(old, key=lambda v: v.lab):
            n = new_by_lab.pop(v.lab, None)
            rows.append(
                {
                    "lab": bidder_seat(v.lab),
                    "score": (v.total, n.total if n else None),
                    "granted": (v.granted, n.granted if n else 0),
                    "false_claims": (list(v.false_claims), list(n.false_claims) if n else []),
                    "rationale": (v.rationale, n.rationale if n else None),
                }
            )
        for lab, n in sorted(new_by_lab.items()):
            rows.append(
                {
                    "lab": bidder_seat(lab),
                    "score": (None, n.total),
                    "granted": (0, n.granted),
                    "false_claims": ([], list(n.false_claims)),
                    "rationale": (None, n.rationale),
                }
            )
        per_round.append({"round": rec.round, "verdicts": rows})

    t = _load(source, partial, verify=True)
    reader = make_reader(spec)
    with _shadow_judge(other, calls):
        report = replay(t, partial=partial, on_round=on_round, conduct_reader=reader)
    if reader is None:
        return RejudgeReport(report, spec, per_round)
    conduct = ConductRejudge(spec, recorded_scores(t), jsonable(report.conduct_scores))
    if t.header.conduct_judge is None:
        conduct.notes.append("recorded before the conduct judge: no scores to compare")
    return RejudgeReport(report, spec, per_round, conduct)


# ---------------------------------------------------------------------------------------------
# the `gpumarket replay` command
# ---------------------------------------------------------------------------------------------
def transcript_files(paths: list[Path]) -> list[Path]:
    """The transcripts that ``paths`` name: files as given; for a folder, its ``*.jsonl`` (in
    episode order) and those of its subfolders; for a run folder, its ``transcripts/`` only."""
    files: list[Path] = []
    for p in paths:
        files += folder_transcripts(p) if p.is_dir() else [p]
    return files


def folder_transcripts(folder: Path) -> list[Path]:
    """Every transcript below ``folder``, a run folder's results and rounds files left out."""
    if (folder / "run.json").is_file() and (folder / "transcripts").is_dir():
        folder = folder / "transcripts"  # a run folder (market.run.runner): its transcripts
    files = sorted(folder.glob("*.jsonl"), key=lambda f: (len(f.stem), f.stem))
    for sub in sorted(d for d in folder.iterdir() if d.is_dir()):
        files += folder_transcripts(sub)
    return files
