"""The GRPO reward: :class:`EnvReward`, a TRL reward function that scores a completion by
stepping the real env from a recorded state (the prompt rows come from
:func:`market.train.training_data.grpo_records`), and :func:`reward_rate`, its benchmark."""

from __future__ import annotations

import copy
import hashlib
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from agents.llm.agent import LLMAgent
from agents.registry import make_agent
from market.core.actions import ActionParseError
from market.core.seats import DESIGNER
from market.record.transcript import Transcript, TranscriptError, parse_transcript
from market.review.replay import scenario_of
from market.run.rollout import default_seats, fallback_action
from market.train.replayer import Replayer

HORIZONS = ("step", "round", "episode", "steps:N", "rounds:N")


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
    env_error: (
        str | None
    )  # the env rejected the action (its invalid-action penalty is in env_return)
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
            self.score(
                transcript[k],
                int(step[k]),
                completions[k],
                None if transcript_sha256 is None else transcript_sha256[k],
            )
            for k in range(len(completions))
        ]
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and details:
            log_metric(
                "gpumarket/parse_failure_rate",
                sum(d.parse_error is not None for d in details) / len(details),
            )
        return [d.reward for d in details]

    # --- one completion -------------------------------------------------------------------
    def score(
        self, transcript: str | Path, step: int, completion: Any, sha256: str | None = None
    ) -> RewardDetail:
        """Score one completion at ``step`` of ``transcript`` (see the class docstring)."""
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
            action = parser.parse_reply(text, obs, semantic=False)
        except ActionParseError as exc:
            parse_error = str(exc)
            action = parser.fallback_action(obs)
        penalty = 0.0
        if parse_error is not None:
            penalty = (
                env.scenario.rewards.invalid_action_penalty
                if self.parse_failure_penalty is None
                else self.parse_failure_penalty
            )
        env_return, steps, env_error = self._play(env, agents, seat, action)
        self.stats["scored"] += 1
        return RewardDetail(
            reward=env_return - penalty,
            env_return=env_return,
            penalty=penalty,
            action=action.model_dump(mode="json", exclude_none=True),
            parse_error=parse_error,
            env_error=env_error,
            steps=steps,
        )

    def _play(
        self, env: Any, agents: dict[str, Any], seat: str, action: Any
    ) -> tuple[float, int, str | None]:
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
        base = max(
            (k for k in self._snapshots if k[:2] == key[:2] and k[2] <= step),
            key=lambda k: k[2],
            default=None,
        )
        if base is not None:  # continue a copy of the nearest earlier snapshot
            env, agents = copy.deepcopy((self._snapshots[base].env, self._snapshots[base].agents))
            replayer = Replayer(t, env=env, next_step=base[2])
        else:
            replayer = Replayer(t)
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


def reward_rate(
    reward: EnvReward,
    rows: Sequence[Mapping[str, Any]],
    completions: Sequence[str],
    seconds: float = 2.0,
) -> float:
    """Reward-function calls per second over ``rows`` x ``completions`` (a benchmark)."""
    calls, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        for row in rows:
            for c in completions:
                reward.score(row["transcript"], int(row["step"]), c)
                calls += 1
    return calls / (time.perf_counter() - began)
