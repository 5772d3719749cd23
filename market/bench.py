"""``gpumarket bench``: throughput of the env and the clearing engine on this machine.

Targets (2-core machine): >= 10,000 AEC steps/s in ``market_round`` with scripted agents in every
seat (one process), and clearing one round of a 1,000-bidder, 10,000-block market in < 20 ms.
Figures are measured, never asserted in tests (shared machines are noisy).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from market.environment import raw_env
from market.mechanisms import bench_clearing
from market.rollout import default_seats, run_episode
from scenarios import builtin_names

TARGET_STEPS_PER_SECOND = 10_000
TARGET_CLEARING_MS = 20.0


def bench_scenario(name: str, seconds: float = 2.0, seed0: int = 0) -> dict[str, Any]:
    """Episodes with the scenario's default scripted seats for about ``seconds``, one process."""
    env = raw_env(name)
    run_episode(name, seed0, env=env)  # warm-up
    steps = episodes = 0
    start = time.perf_counter()
    seed = seed0
    while time.perf_counter() - start < seconds or episodes < 3:
        steps += run_episode(name, seed, env=env).steps
        episodes += 1
        seed += 1
    elapsed = time.perf_counter() - start
    return {"scenario": name, "episodes": episodes, "steps": steps,
            "steps_per_s": steps / elapsed, "episodes_per_s": episodes / elapsed,
            "seats": default_seats(env.scenario)}


def bench_env_clearing(n_labs: int = 1000, blocks: int = 10_000, repeats: int = 5) -> dict[str, float]:
    """Wall time of the env step that clears a round (auction, settlement, execution, rewards)
    in a market of ``n_labs`` truthful bidders and ``blocks`` blocks. Median over ``repeats``."""
    from agents.scripted import truthful_bid

    samples = []
    for rep in range(repeats):
        env = raw_env("market_round", rounds=2, negotiation_turns=0, designer_seat=False,
                      labs={"count": n_labs, "jobs": [2, 4], "endowment": [0, 0]},
                      jobs={"size": [4, 12]}, capacity={"blocks": [blocks, blocks]},
                      shocks=[], shock_rates={})
        env.reset(seed=rep)
        while env.agent_selection != f"bidder_{n_labs - 1}":  # bid for everyone but the last lab
            env.step(truthful_bid(env.observe(env.agent_selection)))
        last = truthful_bid(env.observe(env.agent_selection))
        start = time.perf_counter()
        env.step(last)
        samples.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples)}


def run_bench(seconds: float = 2.0, scenarios: list[str] | None = None) -> dict[str, Any]:
    rows = [bench_scenario(name, seconds) for name in (scenarios or builtin_names())]
    return {"scenarios": rows, "clear_1000x10000_ms": bench_clearing(), "env_clearing_1000x10000": bench_env_clearing()}


def print_bench(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="AEC throughput, scripted agents in every seat (one process)")
    for col in ("scenario", "episodes", "steps", "steps/s", "episodes/s"):
        table.add_column(col, justify="right" if col != "scenario" else "left")
    for row in report["scenarios"]:
        table.add_row(row["scenario"], str(row["episodes"]), str(row["steps"]),
                      f"{row['steps_per_s']:,.0f}", f"{row['episodes_per_s']:,.1f}")
    console.print(table)
    market = next((r for r in report["scenarios"] if r["scenario"] == "market_round"), None)
    if market is not None:
        ok = market["steps_per_s"] >= TARGET_STEPS_PER_SECOND
        console.print(f"market_round: {market['steps_per_s']:,.0f} steps/s (target >= {TARGET_STEPS_PER_SECOND:,}) "
                      + ("[green]OK[/green]" if ok else "[red]BELOW TARGET[/red]"))
    clear_table = Table(title="Clearing 1,000 bidders x 10,000 blocks (median ms)")
    clear_table.add_column("auction_type")
    clear_table.add_column("ms", justify="right")
    for name, ms in report["clear_1000x10000_ms"].items():
        clear_table.add_row(name, f"{ms:.2f}")
    env_ms = report["env_clearing_1000x10000"]["median_ms"]
    clear_table.add_row("whole env clearing step (second_price)", f"{env_ms:.2f}")
    console.print(clear_table)
    worst = max([*report["clear_1000x10000_ms"].values(), env_ms])
    console.print(f"slowest clearing: {worst:.2f} ms (target < {TARGET_CLEARING_MS:g} ms) "
                  + ("[green]OK[/green]" if worst < TARGET_CLEARING_MS else "[red]ABOVE TARGET[/red]"))
