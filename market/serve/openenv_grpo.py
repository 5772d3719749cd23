"""GRPO through the OpenEnv server: prompt rows made from sessions' first observations, and
:class:`OpenEnvReward`, a TRL reward function that scores a completion by playing it in a fresh
session of the server.

The rule, for each completion of a row (``scenario``, ``seat``, ``seed``, ``lineup``):

1. **Reset** a session with the row's options. Sessions are deterministic, so the learner sees
   exactly the observation the row's prompt was made from (common random numbers: every
   completion of a GRPO group meets the same world).
2. **Parse** the completion exactly as that seat's LLM agent parses a reply
   (:meth:`agents.llm.agent.LLMAgent.parse_reply`: lenient JSON extraction, action validation,
   a type legal now, addressed to this seat), as ``market.train.grpo.EnvReward`` does. An
   unusable completion plays the agent's ``safe`` fallback (``wait``, or an empty bid when
   bidding) and costs ``parse_failure_penalty`` (default: the scenario's
   ``invalid_action_penalty``). A usable action the market then rejects (an offer that does not
   exist, a budget it exceeds) costs the env's own invalid-action penalty, in the env reward.
3. **Step** the session with it, then play on to the ``horizon`` with the ``continuation`` agent
   in the learner's seat: ``"step"`` (the decision's reward alone: what the seat earned until its
   next turn), ``"round"`` (through the learner's first turn after the decision's round closed, so
   the round's clearing is in) or ``"episode"``.
4. **Score**: the learner's summed env reward from the decision on, minus the parse penalty.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agents.llm.agent import LLMAgent
from agents.llm.prompts import prompt_messages
from agents.registry import make_agent
from market.core.actions import ActionParseError
from market.core.seats import DESIGNER
from market.serve.openenv_env import MarketObservation
from scenarios import load_scenario

HORIZONS = ("step", "round", "episode")


def _lineup(value: Any) -> dict[str, str]:
    if value is None or value == "":
        return {}
    return dict(json.loads(value) if isinstance(value, str) else value)


def openenv_prompts(
    env: Any,
    scenario: str,
    seat: str,
    seeds: Sequence[int],
    lineup: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One GRPO row per seed: the learner's first decision as the chat messages an LLM seat is
    sent (``prompt``), and the columns :class:`OpenEnvReward` needs (``lineup`` as JSON text,
    so that every row has the same column types). ``env``: a connected sync
    :class:`~market.serve.openenv_client.MarketEnvClient`."""
    rows = []
    for seed in seeds:
        result = env.reset(scenario=scenario, seat=seat, seed=int(seed), lineup=dict(lineup or {}))
        obs = result.observation.seat_observation()
        if obs is None:
            raise ValueError(f"{scenario}, seed {seed}: {seat} never gets a turn")
        rows.append(
            {
                "prompt": prompt_messages(obs),
                "scenario": scenario,
                "seat": seat,
                "seed": int(seed),
                "lineup": json.dumps(dict(lineup or {}), sort_keys=True),
                "phase": obs.phase,
            }
        )
    return rows


class _NoBackend:
    """The parsing agent never calls a model."""

    model = "none"


class OpenEnvReward:
    """A TRL reward function (``reward(prompts, completions, scenario=[...], seat=[...],
    seed=[...], lineup=[...]) -> list[float]``) scored through the OpenEnv server; see the module
    docstring. ``env``: a connected sync :class:`~market.serve.openenv_client.MarketEnvClient`
    (one session, reset for every completion)."""

    def __init__(
        self,
        env: Any,
        horizon: str = "round",
        *,
        continuation: str = "truthful",
        parse_failure_penalty: float | None = None,
    ) -> None:
        if horizon not in HORIZONS:
            raise ValueError(f"horizon {horizon!r}: use one of {', '.join(HORIZONS)}")
        self.env = env
        self.horizon = horizon
        self.continuation = continuation
        self.parse_failure_penalty = parse_failure_penalty
        self.__name__ = "gpumarket_openenv_reward"  # TRL names the reward column after it
        self.parse_failures = 0
        self.scored = 0

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        scenario: Sequence[str] | None = None,
        seat: Sequence[str] | None = None,
        seed: Sequence[int] | None = None,
        lineup: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        if scenario is None or seat is None or seed is None:
            raise ValueError(
                "OpenEnvReward needs the dataset columns 'scenario', 'seat' and 'seed' "
                "(build the rows with market.serve.openenv_grpo.openenv_prompts)"
            )
        return [
            self.score(
                scenario[k],
                seat[k],
                int(seed[k]),
                _completion_text(completions[k]),
                _lineup(None if lineup is None else lineup[k]),
            )
            for k in range(len(completions))
        ]

    def score(
        self,
        scenario: str,
        seat: str,
        seed: int,
        completion: str,
        lineup: Mapping[str, str] | None = None,
    ) -> float:
        """One completion's reward (see the module docstring)."""
        result = self.env.reset(scenario=scenario, seat=seat, seed=seed, lineup=dict(lineup or {}))
        first: MarketObservation = result.observation
        obs = first.seat_observation()
        if obs is None:
            raise ValueError(f"{scenario}, seed {seed}: {seat} never gets a turn")
        parser = LLMAgent(_NoBackend(), fallback="safe")  # type: ignore[arg-type]
        penalty = 0.0
        try:
            action = parser.parse_reply(completion, obs, semantic=False)
        except ActionParseError:
            self.parse_failures += 1
            action = parser.fallback_action(obs)
            penalty = (
                load_scenario(scenario).rewards.invalid_action_penalty
                if self.parse_failure_penalty is None
                else self.parse_failure_penalty
            )
        result = self.env.step(action)
        total = float(result.reward or 0.0)
        policy = make_agent(self.continuation, "designer" if seat == DESIGNER else "bidder")
        policy.reset(0)
        while not result.done and self._goes_on(obs.round, result.observation):
            result = self.env.step(policy.act(result.observation.seat_observation()))
            total += float(result.reward or 0.0)
        self.scored += 1
        return total - penalty

    def _goes_on(self, decision_round: int, now: MarketObservation) -> bool:
        if self.horizon == "step":
            return False
        if self.horizon == "episode":
            return True
        return now.observation is not None and now.observation["round"] <= decision_round


def _completion_text(completion: Any) -> str:
    """A TRL completion as text: a string, or chat messages (the last one's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and completion and isinstance(completion[-1], Mapping):
        return str(completion[-1].get("content") or "")
    return str(completion or "")


__all__ = ["HORIZONS", "OpenEnvReward", "openenv_prompts"]
