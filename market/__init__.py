"""gpumarket: a PettingZoo AEC environment of a scarce-GPU economy, and its scripting API.

The environment: ``market.env(scenario="market_round")`` builds the wrapped AEC env,
``market.raw_env`` the bare one and ``market.parallel_env`` the parallel view.

The scripting API (docs/running.md, "Scripting API"), one name per job:

* :func:`run_episode`: one episode of a scenario with an agent per seat -> ``EpisodeResult``;
* :func:`run_scenario`: a seed range into a resumable run folder -> ``RunSummary``;
* :func:`evaluate`: agents x scenarios in one seat -> ``EvalTable``;
* :func:`compare_mechanisms`: candidate mechanisms and bidder deviations -> ``MechanismReport``;
* :func:`run_tournament`: per-role OpenSkill ratings over a ``TournamentConfig`` -> ``TournamentResult``;
* :func:`replay`: replay a transcript and verify it bit for bit -> ``ReplayReport``;
* :func:`clear`: the clearing function of the auctions (bids, capacity, auction type -> outcome).

The rooms behind them: ``market.core`` (the economics), ``market.environment`` (the AEC env),
``market.record`` (transcripts, replay, reports), ``market.run`` (episodes, runs, evaluation,
tournaments), ``market.train``, ``market.bench`` and ``market.cli`` (docs/design.md, section 10).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from market.version import __version__

# The scripting API loads on first use, not when ``market`` is imported: every import of a
# submodule (``market.core.mechanisms``, or ``scenarios`` and ``agents`` which import the core)
# runs this file first, so importing the env, the runner and the record here would make the light
# core pull in the whole stack, and would make ``import agents.registry`` before ``import market``
# a circular import. One table says where each name lives.
_API: dict[str, tuple[str, str]] = {
    "clear": ("market.core.mechanisms", "clear"),
    "env": ("market.environment", "env"),
    "raw_env": ("market.environment", "raw_env"),
    "parallel_env": ("market.environment", "parallel_env"),
    "replay": ("market.review.replay", "replay"),
    "evaluate": ("market.run.evaluation", "evaluate"),
    "compare_mechanisms": ("market.review.mechanism_comparison", "evaluate_mechanisms"),
    "run_episode": ("market.run.rollout", "run_episode"),
    "run_scenario": ("market.run.runner", "run_scenario"),
    "run_tournament": ("market.run.tournament", "run_tournament"),
    "TournamentConfig": ("market.run.tournament", "TournamentConfig"),
}

if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from market.core.mechanisms import clear
    from market.environment import env, parallel_env, raw_env
    from market.review.mechanism_comparison import evaluate_mechanisms as compare_mechanisms
    from market.review.replay import replay
    from market.run.evaluation import evaluate
    from market.run.rollout import run_episode
    from market.run.runner import run_scenario
    from market.run.tournament import TournamentConfig, run_tournament


def __getattr__(name: str) -> object:
    if name not in _API:
        raise AttributeError(f"module 'market' has no attribute {name!r}")
    module, attribute = _API[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # once loaded, a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))


__all__ = [
    "TournamentConfig",
    "__version__",
    "clear",
    "compare_mechanisms",
    "env",
    "evaluate",
    "parallel_env",
    "raw_env",
    "replay",
    "run_episode",
    "run_scenario",
    "run_tournament",
]
