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

# first: modules that read the version while this package is still importing can find it
from market.version import __version__  # isort: skip

from market.core.mechanisms import clear
from market.environment import env, parallel_env, raw_env
from market.record.replay import replay
from market.run.evaluation import evaluate
from market.run.mechanism_comparison import evaluate_mechanisms
from market.run.rollout import run_episode
from market.run.runner import run_scenario
from market.run.tournament import TournamentConfig, run_tournament

#: :func:`market.run.mechanism_comparison.evaluate_mechanisms` under the scripting API's name
compare_mechanisms = evaluate_mechanisms

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
