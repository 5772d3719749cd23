"""Run folders: a run's manifest (configuration and its hash), the results and rounds files,
and resuming (which seeds a folder already holds complete). See :mod:`market.run.runner` for
what a run folder holds.

A folder holds one configuration: the scenario (less the run-only keys), every seat's spec
(secrets masked) and the code of every seat's agent (:mod:`market.run.agent_code`: its class,
its distribution and version, the hashes of its modules' source). A run whose configuration
differs is refused with the first difference named (a seat, a scenario key, an agent whose code
changed), never mixed in; ``fresh`` starts the folder over.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agents.registry import AgentSpecError, make_agent
from agents.specs_redact import redact_spec
from market.core.scenario_schema import RUN_ONLY_KEYS, Scenario
from market.core.seats import DESIGNER
from market.record.writer import first_difference
from market.run.agent_code import agents_code, describe_code_change
from market.run.deadlines import with_agent_timeout
from market.run.jobs import EpisodeJob, EpisodeLines, RunConfigError, episode_lines, json_line
from market.run.rollout import resolve_seats
from market.version import __version__
from scenarios import load_scenario

if TYPE_CHECKING:
    from pydantic.main import IncEx

FORMAT = 1
MANIFEST = "run.json"
RESULTS = "results.jsonl"
ROUNDS = "rounds.jsonl"
TRANSCRIPTS = "transcripts"


# ----------------------------------------------------------------------------- configuration


#: scenario keys left out of a run's configuration (e.g. agent_timeout: a run can be resumed
#: with another --agent-timeout)
NOT_CONFIG = RUN_ONLY_KEYS


def shown_seats(seats: Mapping[str, str]) -> dict[str, str]:
    """Seat -> spec with secrets masked (``token=***``): what a run folder's files hold."""
    return {seat: redact_spec(spec) for seat, spec in seats.items()}


def config_hash(
    scenario: Scenario, seats: Mapping[str, str], code: Mapping[str, Any] | None = None
) -> str:
    """A hash of everything an episode's rows depend on besides the seed: the scenario, the seat
    specs and the agents' code (``code``: :func:`market.run.agent_code.agents_code`). Specs are
    hashed with their secrets masked: a new token for the same agent service is the same run
    (and the hash, which rows and the manifest carry, is no test for guessing the token)."""
    payload: dict[str, Any] = {
        "scenario": scenario.model_dump(mode="json", exclude=cast("IncEx", NOT_CONFIG)),
        "seats": dict(sorted(shown_seats(seats).items())),
    }
    if code is not None:
        payload["agent_code"] = code
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scenario_digest(scenario: Scenario) -> str:
    text = json.dumps(
        scenario.model_dump(mode="json", exclude=cast("IncEx", NOT_CONFIG)),
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_seats(scenario: Scenario, seats: Mapping[str, Any] | None) -> dict[str, str]:
    """Every seat's spec (scenario defaults plus ``seats``), each checked by building it once."""
    return built_seats(scenario, seats)[0]


def built_seats(
    scenario: Scenario, seats: Mapping[str, Any] | None
) -> tuple[dict[str, str], dict[str, type[Any]]]:
    """:func:`check_seats`, plus the class of the agent each seat's spec built (whose code the
    run folder records)."""
    for seat, spec in (seats or {}).items():
        if not isinstance(spec, str):
            raise RunConfigError(
                f"seat {seat}: the runner takes agent spec strings (e.g. 'truthful', "
                "'py:package.module:Class?key=value'), so that worker processes can build the "
                f"agent and the run folder can record it; got {type(spec).__name__}"
            )
    types: dict[str, type[Any]] = {}
    try:
        resolved = resolve_seats(scenario, seats)
        for seat, spec in resolved.items():
            types[seat] = type(make_agent(spec, "designer" if seat == DESIGNER else "bidder"))
    except AgentSpecError as exc:
        raise RunConfigError(str(exc)) from None
    except ValueError as exc:
        raise RunConfigError(str(exc)) from None
    return resolved, types


def _scenario(scenario: str | Path | Scenario) -> Scenario:
    return load_scenario(scenario)  # ScenarioError (a ValueError) names the file, key, problem


# ----------------------------------------------------------------------------- one folder


@dataclass
class RunFolder:
    """One run folder: its configuration, what is already complete, and the open results file."""

    out: Path
    scenario: Scenario
    seats: dict[str, str]
    seeds: list[int]
    config: str
    transcripts: bool
    digest_every: int
    #: agent name -> the code it runs (:func:`market.run.agent_code.agents_code`)
    code: dict[str, Any] = field(default_factory=dict)
    done: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    rounds: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    played: list[int] = field(default_factory=list)
    _results: io.TextIOWrapper | None = None
    _rounds: io.TextIOWrapper | None = None

    @property
    def pending(self) -> list[int]:
        return [s for s in self.seeds if s not in self.done]

    def manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "kind": "gpumarket run",
            "config_hash": self.config,
            "scenario_name": self.scenario.name,
            "scenario_digest": scenario_digest(self.scenario),
            "seats": shown_seats(self.seats),
            "agent_code": self.code,
            "scenario": self.scenario.model_dump(mode="json"),
            "package_version": __version__,
        }

    def open(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        if self.transcripts:
            (self.out / TRANSCRIPTS).mkdir(exist_ok=True)
        self._rounds = open(self.out / ROUNDS, "a", encoding="utf-8")  # noqa: SIM115
        self._results = open(self.out / RESULTS, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        for fh in (self._rounds, self._results):
            if fh is not None:
                fh.close()
        self._rounds = self._results = None

    def record(
        self,
        seed: int,
        rows: list[dict[str, Any]],
        rounds: list[dict[str, Any]],
        lines: EpisodeLines | None = None,
    ) -> None:
        """Append the episode: its round log, then its rows in one write (the completion mark).

        ``lines``: the episode's text when the worker already encoded it (:func:`episode_lines`
        of this folder's config and the same outcome)."""
        assert self._results is not None and self._rounds is not None
        if lines is None:
            lines = episode_lines(self.config, seed, rows, rounds)
        self._rounds.write(lines[0])
        self._rounds.flush()
        self._results.write(lines[1])
        self._results.flush()
        self.done[seed] = rows
        self.rounds[seed] = rounds
        self.played.append(seed)

    def job(self, seed: int) -> EpisodeJob:
        transcript = str(self.out / TRANSCRIPTS) if self.transcripts else None
        return (self.scenario, seed, self.seats, transcript, self.digest_every, self.config)


def read_jsonl(path: Path) -> Iterator[dict[str, Any] | None]:
    """Each line parsed, or None for a line that is not a JSON object (e.g. cut by a crash)."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                obj = json.loads(line)
            except ValueError:
                yield None
                continue
            yield obj if isinstance(obj, dict) and line.endswith("\n") else None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _describe_difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    if old.get("seats") != new["seats"]:
        seats = sorted(set(old.get("seats") or {}) | set(new["seats"]))
        for seat in seats:
            was, now = (old.get("seats") or {}).get(seat), new["seats"].get(seat)
            if was != now:
                return f"seat {seat} holds {was!r} there but {now!r} now"

    def config(scenario: Any) -> Any:
        if not isinstance(scenario, dict):
            return scenario
        return {k: v for k, v in scenario.items() if k not in NOT_CONFIG}

    diff = first_difference(config(old.get("scenario")), config(new["scenario"]), "scenario")
    if diff is not None:
        return f"{diff[0]} is {diff[1]!r} there but {diff[2]!r} now"
    return describe_code_change(old.get("agent_code"), new["agent_code"]) or (
        "its configuration differs"
    )


def _load(folder: RunFolder, fresh: bool) -> None:
    """Check the manifest (or write it), and collect the complete episodes already there."""
    out = folder.out
    manifest_path, results_path, rounds_path = out / MANIFEST, out / RESULTS, out / ROUNDS
    if fresh:
        for path in (manifest_path, results_path, rounds_path, out / "report.html"):
            path.unlink(missing_ok=True)
        tdir = out / TRANSCRIPTS
        if tdir.is_dir():
            for path in tdir.glob("*.jsonl"):
                if path.stem.lstrip("-").isdigit():
                    path.unlink()
        pages = out / "episodes"  # the run report's episode pages (market.review.report.run_page)
        if pages.is_dir():
            for path in pages.glob("*.html"):
                if path.stem.lstrip("-").isdigit():
                    path.unlink()
    new = folder.manifest()
    if out.exists() and not out.is_dir():
        raise RunConfigError(f"{out} is a file, not a run folder")
    if manifest_path.is_file():
        try:
            old = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RunConfigError(
                f"{manifest_path} is unreadable ({exc}); remove it or use --fresh"
            ) from None
        if not isinstance(old, dict) or old.get("config_hash") != folder.config:
            what = _describe_difference(old if isinstance(old, dict) else {}, new)
            raise RunConfigError(
                f"{out} holds a run of another configuration ({what}); use another output folder, "
                "or start over with --fresh (fresh=True in Python)"
            )
    rows_by_seed: dict[int, list[dict[str, Any]]] = defaultdict(list)
    dropped = 0
    for row in read_jsonl(results_path):
        if row is None or not isinstance(row.get("seed"), int):
            dropped += 1
            continue
        if row.get("config") != folder.config:
            raise RunConfigError(
                f"{results_path} holds rows of another configuration (config {row.get('config')}, "
                f"this run is {folder.config}); use another output folder, or start over with --fresh"
            )
        rows_by_seed[row["seed"]].append(row)
    need = set(folder.seats)
    for seed, rows in rows_by_seed.items():
        by_seat = {r["seat"]: r for r in rows}
        if set(by_seat) >= need and len(rows) == len(need):
            folder.done[seed] = [by_seat[s] for s in folder.seats]
        else:
            dropped += len(rows)
    for entry in read_jsonl(rounds_path):
        if entry is not None and entry.get("seed") in folder.done:
            folder.rounds[entry["seed"]] = entry.get("rounds", [])
    out.mkdir(parents=True, exist_ok=True)
    if not manifest_path.is_file():
        _write_atomic(manifest_path, json.dumps(new, indent=1) + "\n")
    if dropped or len(folder.rounds) != sum(1 for _ in read_jsonl(rounds_path)):
        # rewrite both files with the complete episodes only (in seed order)
        order = sorted(folder.done)
        _write_atomic(results_path, "".join(json_line(r) for s in order for r in folder.done[s]))
        _write_atomic(
            rounds_path,
            "".join(
                json_line({"config": folder.config, "seed": s, "rounds": folder.rounds.get(s, [])})
                for s in order
            ),
        )


def open_folder(
    scenario: str | Path | Scenario,
    seeds: Iterable[int],
    seats: Mapping[str, Any] | None,
    out_dir: str | Path,
    transcripts: bool,
    fresh: bool,
    digest_every: int,
    agent_timeout: float | None = None,
) -> RunFolder:
    sc = _scenario(scenario)
    try:
        sc = with_agent_timeout(sc, agent_timeout)
    except ValueError as exc:
        raise RunConfigError(str(exc)) from None
    resolved, types = built_seats(sc, seats)
    code = agents_code(resolved, types)
    seed_list = list(dict.fromkeys(int(s) for s in seeds))
    folder = RunFolder(
        Path(out_dir),
        sc,
        resolved,
        seed_list,
        config_hash(sc, resolved, code),
        transcripts,
        digest_every,
        code,
    )
    _load(folder, fresh)
    return folder


def read_results(out_dir: str | Path) -> list[dict[str, Any]]:
    """Every complete row of a run folder's ``results.jsonl``."""
    return [r for r in read_jsonl(Path(out_dir) / RESULTS) if r is not None]
