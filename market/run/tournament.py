"""Role-aware tournaments: bidders are rated against each other, designers against populations.

Two kinds of match, rated by two separate OpenSkill (Plackett-Luce) models:

* **bidder matches**: for every seed, the bidder agents rotate through the scenario's bidder
  seats (:func:`bidder_lineups`); the designer seat holds a fixed *house* designer. A match is one
  episode, a multi-player game among the distinct agents in the lineup, ranked by episode return
  (an agent holding several seats scores the mean of their returns; equal returns tie).
* **designer matches**: every designer plays the designer seat against the same bidder
  populations on the same seeds. The episodes of one (population, seed) form one game among the
  designers, ranked by the designer seat's return.

Every finished episode is appended to ``DIR/matches.jsonl`` as one JSON line (id, lineup, seed,
returns). Ratings are recomputed from that file in schedule order, so they are a deterministic
function of the match list: a run that stops half way and is started again plays only the
missing episodes and ends with the same table as an uninterrupted run, serial or parallel.
``DIR/manifest.json`` records the configuration, and the code of every agent it seats
(:mod:`market.run.agent_code`), and refuses to mix two tournaments, or two versions of an agent,
in one folder.

    >>> cfg = TournamentConfig("market_round", bidders=("truthful", "random_valid"),
    ...                        designers=("fixed", "rule_designer"), seeds=(0, 1, 2))
    >>> result = run_tournament(cfg, "runs/tournament", workers=4)   # doctest: +SKIP
    >>> result.rows[0]["agent"], result.rows[0]["mu"]                 # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from openskill.models import PlackettLuce

from market.core.scenario_schema import Scenario
from market.core.seats import DESIGNER
from market.run.agent_code import describe_code_change
from market.run.conduct_table import seat_score, summarize
from market.run.deadlines import with_agent_timeout
from market.run.health import judge_counts, seat_counts
from market.run.ray_backend import RayBackendError, ray_map
from market.run.rollout import mean_ci95, run_episode
from market.run.tournament_plan import (
    FORMAT,
    MIXED_POPULATION,
    Match,
    Plan,
    TournamentConfig,
    TournamentError,
    bidder_lineups,
    bidder_seats,
    plan,
)
from market.run.tournament_tables import (
    CSV_COLUMNS,
    display_rows,
    markdown,
    rich_table,
    to_csv,
    write_outputs,
)
from market.run.worker_pool import TaskFailed, WorkerPool

MATCHES_FILE = "matches.jsonl"
MANIFEST_FILE = "manifest.json"


# ----------------------------------------------------------------------------- ratings


@dataclass
class Standing:
    """One agent's rating and record in one role."""

    role: str
    agent: str
    mu: float
    sigma: float
    matches: int = 0
    wins: float = 0.0  # a first place shared by k agents counts 1/k
    returns: list[float] = field(default_factory=list)
    tokens: int = 0  # model tokens (prompt + completion) of the agent's seats in this role
    cost_usd: float = 0.0  # and their cost, priced by the seat spec's price_prompt/completion
    # the conduct score of each of the agent's seat-episodes (None: recorded before the judge)
    conduct: list[Mapping[str, Any] | None] = field(default_factory=list)

    @property
    def ordinal(self) -> float:
        return self.mu - 3.0 * self.sigma

    def row(self) -> dict[str, Any]:
        low, high = wilson_ci95(self.wins, self.matches)
        mean, half = mean_ci95(self.returns)
        return {
            "role": self.role,
            "agent": self.agent,
            "mu": self.mu,
            "sigma": self.sigma,
            "ordinal": self.ordinal,
            "matches": self.matches,
            "wins": self.wins,
            "win_rate": self.wins / self.matches if self.matches else float("nan"),
            "win_ci_low": low,
            "win_ci_high": high,
            "mean_return": mean,
            "return_ci95": half,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            **summarize(self.conduct).columns(),
        }


def wilson_ci95(wins: float, n: int) -> tuple[float, float]:
    """The Wilson score 95% interval of a win share ``wins / n`` (nan, nan when n = 0)."""
    if n <= 0:
        return float("nan"), float("nan")
    z = 1.959963984540054
    p = wins / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def rate_games(
    role: str, agents: Sequence[str], games: Iterable[Mapping[str, float]]
) -> list[Standing]:
    """Rate ``agents`` from ``games`` (each: agent -> score, higher is better) in the given order
    with a fresh OpenSkill Plackett-Luce model. Games with fewer than two agents are not rated
    but their scores still count towards the mean return."""
    model = PlackettLuce()
    ratings = {a: model.rating(name=a) for a in agents}
    table = {a: Standing(role, a, ratings[a].mu, ratings[a].sigma) for a in agents}
    rank_of = {a: i for i, a in enumerate(agents)}
    for game in games:
        names = sorted(game, key=rank_of.__getitem__)
        scores = [float(game[a]) for a in names]
        for a, s in zip(names, scores, strict=True):
            table[a].returns.append(s)
        if len(names) < 2:
            continue
        ranks: list[float] = [1 + sum(other > s for other in scores) for s in scores]
        new = model.rate([[ratings[a]] for a in names], ranks=ranks)
        best = max(scores)
        winners = scores.count(best)
        for a, team, s in zip(names, new, scores, strict=True):
            ratings[a] = team[0]
            table[a].matches += 1
            if s == best:
                table[a].wins += 1.0 / winners
    for a in agents:
        table[a].mu, table[a].sigma = ratings[a].mu, ratings[a].sigma
    return list(table.values())


def bidder_games(plan_: Plan, records: Mapping[str, dict[str, Any]]) -> list[dict[str, float]]:
    """Bidder matches in schedule order as agent -> score (mean return over the agent's seats)."""
    games = []
    for m in plan_.matches:
        rec = records.get(m.id)
        if m.kind != "bidder" or rec is None:
            continue
        per_agent: dict[str, list[float]] = {}
        for seat, agent in m.seats.items():
            if seat != DESIGNER:
                per_agent.setdefault(agent, []).append(float(rec["returns"][seat]))
        games.append({a: sum(v) / len(v) for a, v in per_agent.items()})
    return games


def designer_games(plan_: Plan, records: Mapping[str, dict[str, Any]]) -> list[dict[str, float]]:
    """Designer games in schedule order: per (population, seed), designer -> designer return.
    A game is rated only once every designer's episode of it is in."""
    games = []
    for pop in plan_.populations:
        for seed in plan_.seeds:
            ids = [f"designer|{pop}|seed={seed}|{d}" for d in plan_.designers]
            if all(i in records for i in ids):
                games.append(
                    {
                        d: float(records[i]["returns"][DESIGNER])
                        for d, i in zip(plan_.designers, ids, strict=True)
                    }
                )
    return games


def usage(
    plan_: Plan, records: Mapping[str, dict[str, Any]], role: str
) -> dict[str, tuple[int, float]]:
    """agent -> (tokens, USD cost) of the seats it held in the finished matches of ``role``
    (the bidder seats of bidder matches, the designer seat of designer matches)."""
    tokens: dict[str, int] = {}
    costs: dict[str, list[float]] = {}
    for m in plan_.matches:  # schedule order: the same sums however the matches finished
        rec = records.get(m.id)
        if m.kind != role or rec is None:
            continue
        for seat, agent in m.seats.items():
            if (seat == DESIGNER) != (role == "designer"):
                continue
            used = (rec.get("usage") or {}).get(seat) or {}
            tokens[agent] = tokens.get(agent, 0) + int(used.get("tokens", 0))
            costs.setdefault(agent, []).append(float(used.get("cost_usd", 0.0)))
    return {a: (tokens[a], math.fsum(costs[a])) for a in tokens}


def conduct_scores(
    plan_: Plan, records: Mapping[str, dict[str, Any]], role: str
) -> dict[str, list[Mapping[str, Any] | None]]:
    """agent -> the conduct score of each seat it held in the finished matches of ``role``, in
    schedule order (:mod:`market.run.conduct_table`; None for a match recorded without one)."""
    out: dict[str, list[Mapping[str, Any] | None]] = {}
    for m in plan_.matches:
        rec = records.get(m.id)
        if m.kind != role or rec is None:
            continue
        for seat, agent in m.seats.items():
            if (seat == DESIGNER) == (role == "designer"):
                out.setdefault(agent, []).append(seat_score(rec.get("conduct"), seat))
    return out


def standings(plan_: Plan, records: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows: bidders then designers, each by ordinal (mu - 3 sigma), best first."""
    rows: list[dict[str, Any]] = []
    for role, agents, games in (
        ("bidder", plan_.bidders, bidder_games(plan_, records)),
        ("designer", plan_.designers, designer_games(plan_, records)),
    ):
        if agents:
            used = usage(plan_, records, role)
            conduct = conduct_scores(plan_, records, role)
            table = rate_games(role, agents, games)
            for standing in table:
                standing.tokens, standing.cost_usd = used.get(standing.agent, (0, 0.0))
                standing.conduct = conduct.get(standing.agent, [])
            ranked = sorted(table, key=lambda s: (-s.ordinal, s.agent))
            rows.extend(s.row() for s in ranked)
    return rows


def read_manifest(out: Path) -> dict[str, Any] | None:
    path = out / MANIFEST_FILE
    if not path.exists():
        return None
    try:
        return cast("dict[str, Any] | None", json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise TournamentError(f"{path}: unreadable manifest ({exc}); use another --out") from None


def check_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Refuse to resume a folder that holds another configuration's matches."""
    old = read_manifest(out)
    if old is None:
        if (out / MATCHES_FILE).exists():
            raise TournamentError(
                f"{out / MATCHES_FILE} exists but {MANIFEST_FILE} does not; use another --out"
            )
        return
    differ = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
    if "agent_code" in differ and len(differ) > 1:  # other agents: their code differs with them
        differ.remove("agent_code")
    if differ:
        code = describe_code_change(old.get("agent_code"), manifest.get("agent_code") or {})
        why = f": {code}" if "agent_code" in differ and code else ""
        raise TournamentError(
            f"{out} holds a tournament with another configuration (differs in: "
            f"{', '.join(differ)}{why}); use another --out or delete that folder"
        )


def load_records(out: Path, plan_: Plan) -> dict[str, dict[str, Any]]:
    """Finished matches of ``out/matches.jsonl`` by id. A cut last line (a run killed mid-write)
    is dropped from the file; any other bad line is an error."""
    path = out / MATCHES_FILE
    if not path.exists():
        return {}
    by_id = {m.id: m for m in plan_.matches}
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    records: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            match = by_id[rec["id"]]
            ok = rec["seats"] == match.seats and rec["seed"] == match.seed
            ok = ok and set(rec["returns"]) == set(match.seats)
        except (ValueError, KeyError, TypeError):
            if n == len(lines):  # no newline after it: the cut last line of a killed run
                lines.pop()
                break
            raise TournamentError(
                f"{path}:{n}: not a match of this tournament; use another --out"
            ) from None
        if not ok:
            raise TournamentError(
                f"{path}:{n}: match {rec['id']!r} does not fit this "
                "tournament's schedule; use another --out"
            )
        records.setdefault(rec["id"], rec)
    if text and not text.endswith("\n"):  # end the file cleanly before anything is appended
        path.write_text("".join(f"{x}\n" for x in lines if x.strip()), encoding="utf-8")
    return records


def _play(job: tuple[Scenario, Match]) -> dict[str, Any]:
    """Play one match (in a worker process or inline) and return its JSON record."""
    scenario, m = job
    result = run_episode(scenario, m.seed, m.seats)
    rec: dict[str, Any] = {"id": m.id, "kind": m.kind, "seed": m.seed}
    if m.rotation is not None:
        rec["rotation"] = m.rotation
    if m.population is not None:
        rec["population"], rec["designer"] = m.population, m.designer
    stats = {seat: result.agent_stats.get(seat) or {} for seat in m.seats}
    rec.update(
        seats=m.seats,
        returns=result.returns,
        steps=result.steps,
        invalid_actions=result.invalid_actions,
        agent_errors=result.agent_errors,
        health=seat_counts(result),
        judge=judge_counts(result.round_log),
        usage={
            seat: {
                "tokens": int(st.get("prompt_tokens", 0) or 0)
                + int(st.get("completion_tokens", 0) or 0),
                "cost_usd": float(st.get("cost_usd", 0.0) or 0.0),
            }
            for seat, st in stats.items()
        },
        conduct=result.conduct,  # seat -> conduct score (seats the judge recorded)
    )
    return rec


# ----------------------------------------------------------------------------- running


@dataclass
class TournamentResult:
    rows: list[dict[str, Any]]
    total: int  # scheduled matches
    done: int  # matches in matches.jsonl now
    played: int  # matches played by this call
    out: Path

    @property
    def complete(self) -> bool:
        return self.done == self.total


def run_tournament(
    config: TournamentConfig,
    out: str | Path,
    *,
    workers: int = 1,
    max_matches: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    backend: str = "local",
    address: str | None = None,
    agent_timeout: float | None = None,
) -> TournamentResult:
    """Play the missing matches of ``config`` into ``out`` and write the tables.

    ``workers > 1`` plays matches in a local process pool (same results as serial);
    ``backend="ray"`` plays them on the Ray cluster at ``address`` (None: a private local Ray).
    ``max_matches``: stop after playing this many new matches (rerun to continue).
    ``progress(done, total)`` is called once at the start and after every finished match.
    ``agent_timeout``: seconds one decision may take (None: the scenario's; 0: no limit).
    Writes ``out/matches.jsonl``, ``manifest.json``, ``ratings.csv``, ``ratings.md`` and
    ``summary.json``.
    """
    if backend not in ("local", "ray"):
        raise TournamentError(f"backend {backend!r}: use 'local' (a process pool) or 'ray'")
    plan_ = plan(config)
    try:
        scenario = with_agent_timeout(plan_.scenario, agent_timeout)
    except ValueError as exc:
        raise TournamentError(str(exc)) from None
    out = Path(out)
    manifest = plan_.manifest()
    check_manifest(out, manifest)
    out.mkdir(parents=True, exist_ok=True)
    if read_manifest(out) is None:
        (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    records = load_records(out, plan_)
    pending = [m for m in plan_.matches if m.id not in records]
    if max_matches is not None:
        pending = pending[: max(0, max_matches)]
    total = len(plan_.matches)
    done = len(records)
    if progress:
        progress(done, total)
    with open(out / MATCHES_FILE, "a", encoding="utf-8") as sink:

        def save(rec: dict[str, Any]) -> None:
            nonlocal done
            sink.write(json.dumps(rec, sort_keys=True) + "\n")
            sink.flush()
            done += 1
            if progress:
                progress(done, total)

        jobs = [(scenario, m) for m in pending]
        if backend == "ray":
            _play_ray(jobs, address, save)
        elif workers <= 1 or len(jobs) <= 1:
            _play_here(jobs, save)
        else:
            _play_pool(jobs, workers, save)
    records = load_records(out, plan_)
    rows = standings(plan_, records)
    write_outputs(out, plan_, records, rows)
    return TournamentResult(rows, total, len(records), len(pending), out)


def _play_pool(
    jobs: list[tuple[Scenario, Match]], workers: int, save: Callable[[dict[str, Any]], None]
) -> None:
    """Play ``jobs`` in worker processes (:mod:`market.run.worker_pool`), saving each record as
    it finishes; an interrupted run loses at most the matches being played. A match that
    raises, or whose worker dies, stops the tournament with a :class:`TournamentError`."""
    with WorkerPool(_play, min(workers, len(jobs))) as pool:
        for position, rec in pool.imap_unordered(jobs):
            if isinstance(rec, TaskFailed):
                raise _match_failed(jobs[position][1], str(rec))
            save(rec)
        pool.close()


def _play_here(jobs: list[tuple[Scenario, Match]], save: Callable[[dict[str, Any]], None]) -> None:
    """Play ``jobs`` in this process, saving each record as it finishes."""
    for job in jobs:
        try:
            rec = _play(job)
        except Exception as exc:  # an agent or env bug: one line, not a traceback
            raise _match_failed(job[1], f"{type(exc).__name__}: {exc}") from exc
        save(rec)


def _match_failed(match: Match, reason: str) -> TournamentError:
    return TournamentError(
        f"match {match.id} failed: {reason}. The matches finished before it are kept: run the "
        "same command again to resume"
    )


def _play_ray(
    jobs: list[tuple[Scenario, Match]], address: str | None, save: Callable[[dict[str, Any]], None]
) -> None:
    """Play ``jobs`` on Ray (:mod:`market.run.ray_backend`), saving each record as it arrives."""
    try:
        for _, rec in ray_map(_play, jobs, address=address):
            save(rec)
    except RayBackendError as exc:
        raise TournamentError(str(exc)) from None


# ----------------------------------------------------------------------------- output


__all__ = [  # the schedule's names stay importable from here (see market.run.tournament_plan)
    "CSV_COLUMNS",
    "FORMAT",
    "MANIFEST_FILE",
    "MATCHES_FILE",
    "MIXED_POPULATION",
    "Match",
    "Plan",
    "Standing",
    "TournamentConfig",
    "TournamentError",
    "TournamentResult",
    "bidder_lineups",
    "bidder_seats",
    "display_rows",
    "load_records",
    "markdown",
    "plan",
    "rate_games",
    "rich_table",
    "run_tournament",
    "standings",
    "to_csv",
    "write_outputs",
]
