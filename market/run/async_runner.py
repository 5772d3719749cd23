"""The runner's path for runs with LLM seats: episodes as asyncio tasks in this process.

A process pool plays one episode per worker with blocking model calls, so a model server sees at
most ``workers`` requests at a time. Here up to ``max_episodes`` episodes are in flight as tasks
of one event loop, and all their LLM seats share one
:class:`~agents.llm.backends.pool.ClientPool` (one client per endpoint; ``max_in_flight`` requests in
flight in all, ``per_endpoint`` per server), so one vLLM server is kept busy by many episodes.

Each finished episode is handed to ``finished(index, (seed, rows, round_log, error))``, the same
callback the process pool feeds, so run folders, transcripts and resuming work the same way and
rows are identical (only wall-time stats differ).

A :class:`~agents.llm.backends.pool.Budget` is charged with every completion's tokens. Once it is
spent no new episode starts; the episodes in flight finish and are recorded. The budget then
says what was spent and how many episodes were not started (:meth:`Budget.message`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from agents.llm.backends.pool import Budget, ClientPool
from market.run.jobs import Finished, Job, RunConfigError, episode_rows
from market.run.rollout import arun_episode

#: defaults of ``gpumarket run``: requests in flight in all, and episodes in flight per request slot
DEFAULT_MAX_IN_FLIGHT = 16
EPISODES_PER_SLOT = 2


@dataclass
class AsyncOutcome:
    """What :func:`run_jobs_async` did: episodes finished and not started, and the pool's counters."""

    finished: int = 0
    not_started: int = 0
    budget_stopped: bool = False
    seconds: float = 0.0
    pool: dict[str, Any] = field(default_factory=dict)
    peak_episodes: int = 0


def is_llm_spec(spec: Any) -> bool:
    """True for an LLM seat spec (``llm:PROVIDER?...`` or ``llm?...``)."""
    return isinstance(spec, str) and spec.strip().startswith(("llm:", "llm?"))


def llm_models(seat_specs: Sequence[Any]) -> set[str]:
    """The ``model=`` of every LLM seat spec among ``seat_specs``."""
    models = set()
    for spec in seat_specs:
        if is_llm_spec(spec):
            model = dict(parse_qsl(spec.partition("?")[2])).get("model")
            if model:
                models.add(model)
    return models


async def _aplay(
    job: tuple[Any, ...], pool: ClientPool, budget: Budget | None
) -> tuple[int, list[dict[str, Any]] | None, list[Any], str | None]:
    """One episode -> (seed, rows, round log, error), as :func:`market.run.jobs.play` does in a worker."""
    scenario, seed, seats, transcript, digest_every, config = job
    try:
        # the scenario's agent_timeout (the runner puts --agent-timeout there), as in the process
        # pool, so the same seeds give the same rows on both paths
        result = await arun_episode(
            scenario,
            seed,
            seats,
            limiter=pool,
            budget=budget,
            transcript=transcript,
            digest_every=digest_every,
        )
    except Exception as exc:  # an env or agent-construction bug: report it, keep the run going
        return seed, None, [], f"{type(exc).__name__}: {exc}"[:1000]
    return seed, episode_rows(result, config), result.round_log, None


def _check_prices(jobs: Sequence[Job], budget: Budget | None) -> None:
    """A cost limit needs a price for every LLM seat's model, else it could never be reached."""
    if budget is None or budget.max_cost_usd is None:
        return
    # a seat with its own price_prompt/price_completion is priced whatever the table holds
    models = llm_models(
        [
            spec
            for _, job in jobs
            for spec in dict(job[2] or {}).values()
            if "price_prompt=" not in spec and "price_completion=" not in spec
        ]
    )
    missing = sorted(m for m in models if budget.price(m) is None)
    if missing:
        raise RunConfigError(
            f"a cost budget needs a price for every LLM model: no price for {', '.join(missing)}; "
            f"give --price {missing[0]}=IN,OUT (USD per million prompt and completion tokens)"
        )


def run_jobs_async(
    jobs: Sequence[Job],
    finished: Finished,
    *,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    per_endpoint: int | None = None,
    max_episodes: int | None = None,
    budget: Budget | None = None,
    pool: ClientPool | None = None,
) -> AsyncOutcome:
    """Play ``jobs`` (``(index, (scenario, seed, seats, transcript, digest_every, config))``) as
    asyncio tasks, at most ``max_episodes`` at a time (default ``2 * max_in_flight``), calling
    ``finished(index, outcome)`` as each ends.

    ``max_in_flight``/``per_endpoint``: the limits of the shared client pool (or pass ``pool``).
    ``budget``: stop starting episodes once it is spent; it records ``stopped``, ``finished``
    and ``not_started`` for its :meth:`~agents.llm.backends.pool.Budget.message`.
    Ctrl-C cancels the episodes in flight (their transcripts end ``aborted``) and re-raises
    ``KeyboardInterrupt``; every episode already handed to ``finished`` is kept.
    """
    _check_prices(jobs, budget)
    pool = pool if pool is not None else ClientPool(max_in_flight, per_endpoint)
    limit = max(
        1, int(max_episodes) if max_episodes is not None else EPISODES_PER_SLOT * pool.max_in_flight
    )
    outcome = AsyncOutcome()
    began = time.perf_counter()
    queue = deque(jobs)

    async def main() -> None:
        running: dict[asyncio.Task[Any], int] = {}
        try:
            while queue or running:
                while (
                    queue and len(running) < limit and not (budget is not None and budget.exhausted)
                ):
                    index, job = queue.popleft()
                    running[asyncio.create_task(_aplay(job, pool, budget))] = index
                outcome.peak_episodes = max(outcome.peak_episodes, len(running))
                if not running:
                    break  # the budget is spent and nothing is in flight
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    index = running.pop(task)
                    finished(index, task.result())
                    outcome.finished += 1
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            await pool.aclose()

    try:
        asyncio.run(main())
    finally:
        outcome.seconds = time.perf_counter() - began
        outcome.not_started = len(queue)
        outcome.pool = pool.snapshot()
        if budget is not None:
            budget.finished += outcome.finished
            budget.not_started = outcome.not_started
            budget.stopped = budget.exhausted and outcome.not_started > 0
    return outcome


# ------------------------------------------------------------------------------------- command line


def add_llm_arguments(parser: Any) -> None:
    """The LLM-scale options of ``gpumarket run`` (an ``argparse`` parser)."""
    group = parser.add_argument_group(
        "LLM seats",
        "runs with an llm: seat play their episodes as asyncio tasks in this process, "
        "sharing one client pool (see docs/llm-seats.md)",
    )
    group.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        metavar="N",
        help=f"model requests in flight in all (default {DEFAULT_MAX_IN_FLIGHT})",
    )
    group.add_argument(
        "--per-endpoint",
        type=int,
        default=None,
        metavar="N",
        help="model requests in flight per server (default: --max-in-flight)",
    )
    group.add_argument(
        "--episodes-in-flight",
        type=int,
        default=None,
        metavar="N",
        help=f"episodes played at once (default {EPISODES_PER_SLOT} x --max-in-flight)",
    )
    group.add_argument(
        "--budget-tokens",
        type=int,
        default=None,
        metavar="N",
        help="start no new episode once the run used N model tokens",
    )
    group.add_argument(
        "--budget-usd",
        type=float,
        default=None,
        metavar="X",
        help="start no new episode once the run cost X USD (needs --price)",
    )
    group.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=IN,OUT",
        help="USD per million prompt and completion tokens of MODEL (repeatable; "
        "no prices are built in): the run's and each LLM seat's cost_usd, "
        "unless the seat's spec has its own price_prompt/price_completion",
    )


#: the pool and budget flags of :func:`add_llm_arguments` (flag, attribute); None when not given
POOL_FLAGS = (
    ("--max-in-flight", "max_in_flight"),
    ("--per-endpoint", "per_endpoint"),
    ("--episodes-in-flight", "episodes_in_flight"),
    ("--budget-tokens", "budget_tokens"),
    ("--budget-usd", "budget_usd"),
)


def given_llm_flags(args: Any) -> list[str]:
    """The pool and budget flags the user gave (for refusing them where they do not apply)."""
    given = [flag for flag, attr in POOL_FLAGS if getattr(args, attr) is not None]
    return given + (["--price"] if getattr(args, "price", None) else [])  # a list, default []


def llm_options(args: Any) -> dict[str, Any]:
    """``run_jobs_async`` keyword arguments from parsed :func:`add_llm_arguments` options.
    Raises ``ValueError`` with a one-line message for a bad value."""
    for flag, attr in POOL_FLAGS[:4]:
        value = getattr(args, attr)
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: give at least 1")
    if args.budget_usd is not None and not args.budget_usd > 0:
        raise ValueError(f"--budget-usd {args.budget_usd}: give an amount above 0")
    budget = Budget.from_options(args.budget_tokens, args.budget_usd, list(args.price))
    return {
        "max_in_flight": args.max_in_flight or DEFAULT_MAX_IN_FLIGHT,
        "per_endpoint": args.per_endpoint,
        "max_episodes": args.episodes_in_flight,
        "budget": budget,
    }


__all__ = [
    "AsyncOutcome",
    "add_llm_arguments",
    "is_llm_spec",
    "llm_models",
    "llm_options",
    "run_jobs_async",
]
