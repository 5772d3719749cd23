"""Not from the arena: plays one of the arena's own policies (``arena/gpu_budget_arena/baselines.py``,
unchanged) in ``lab_0`` over HTTP against an arena-compatible server, and, run as a script,
reports the returns of the arena's rule-based expert and random policies beside this market's
own agents in the same seat, scenarios and seeds.

    .venv/bin/python tests/compat_seed/arena_play.py --seeds 0:20

Each observation the server sends is validated by the arena's own ``GpuNegotiationObservation``
model; the policy's action is sent as the arena's ``GpuNegotiationAction.model_dump`` (the full
form, nulls included) or with ``exclude_none`` (the compact form).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

SEED_ROOT = Path(__file__).resolve().parent / "arena"
if str(SEED_ROOT) not in sys.path:
    sys.path.insert(0, str(SEED_ROOT))

from gpu_budget_arena import baselines  # noqa: E402  (the arena's file, unchanged)
from gpu_budget_arena.models import GpuNegotiationObservation  # noqa: E402

POLICIES: dict[str, Callable[[GpuNegotiationObservation], Any]] = {
    "arena:rule_based_expert": baselines.rule_based_expert_policy,
    "arena:random_validish": baselines.random_validish_policy,
}
MAX_STEPS = 1000


@dataclass
class Played:
    """One episode a policy played through the server."""

    observations: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    session_id: str = ""
    match_id: str = ""

    @property
    def final(self) -> dict[str, Any]:
        return self.observations[-1]


def play(
    client: httpx.Client,
    policy: Callable[[GpuNegotiationObservation], Any],
    task_type: str,
    difficulty: str | None,
    seed: int,
    *,
    compact: bool = False,
    headers: dict[str, str] | None = None,
    judge_mode: str | None = None,
) -> Played:
    """Reset and step until ``done``; every observation is the arena's model (validated)."""
    config: dict[str, Any] = {"task_type": task_type, "difficulty": difficulty, "seed": seed}
    if judge_mode is not None:
        config["judge_mode"] = judge_mode
    reset = client.post("/reset", json=config, headers=headers)
    reset.raise_for_status()
    body = reset.json()
    out = Played(session_id=body["session_id"], match_id=body["match_id"])
    obs = body["observation"]
    for _ in range(MAX_STEPS):
        out.observations.append(obs)
        model = GpuNegotiationObservation.model_validate(obs)
        if model.done:
            return out
        action = policy(model)
        payload = action.model_dump(mode="json", exclude_none=compact)
        out.actions.append(payload)
        step = client.post("/step", json=payload, headers=headers)
        step.raise_for_status()
        obs = step.json()["observation"]
    raise RuntimeError(f"{task_type}/{difficulty} seed {seed}: not done after {MAX_STEPS} steps")


def main(argv: list[str] | None = None) -> int:
    from market.run.rollout import mean_ci95, run_episode
    from market.serve.compat_arena import CLIENT_SEAT, DEFAULT_DIFFICULTY, create_arena_app
    from market.serve.compat_server import CompatServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:10", help="seed range START:STOP (default 0:10)")
    parser.add_argument(
        "--market-agents",
        default="rule_expert,truthful,random_valid",
        help="this market's agents to play bidder_0 (comma-separated specs)",
    )
    args = parser.parse_args(argv)
    start, stop = (int(x) for x in args.seeds.split(":"))
    seeds = range(start, stop)
    tasks = [(t, d) for t, d in DEFAULT_DIFFICULTY.items()]
    rows: list[tuple[str, str, float, float]] = []
    with tempfile.TemporaryDirectory() as out:
        app = create_arena_app(Path(out))
        with CompatServer(app) as server:
            for name, policy in POLICIES.items():
                for task, difficulty in tasks:
                    returns = []
                    for seed in seeds:
                        with httpx.Client(base_url=server.url, timeout=60) as client:
                            # "rule": the built-in scenario as written, as run_episode plays it
                            played = play(client, policy, task, difficulty, seed, judge_mode="rule")
                        returns.append(played.final["cumulative_reward"])
                    rows.append((name, f"{task}_{difficulty}", *mean_ci95(returns)))
    for spec in args.market_agents.split(","):
        for task, difficulty in tasks:
            scenario = f"{task}_{difficulty}"
            returns = [
                run_episode(scenario, seed, {CLIENT_SEAT: spec}).returns[CLIENT_SEAT]
                for seed in seeds
            ]
            rows.append((spec, scenario, *mean_ci95(returns)))
    print(f"lab_0 / bidder_0 return, seeds {start}..{stop - 1} (mean ± 95% CI half-width)\n")
    print("| agent | scenario | return |")
    print("|---|---|---|")
    for name, scenario, mean, ci in rows:
        print(f"| {name} | {scenario} | {mean:.3f} ± {ci:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
