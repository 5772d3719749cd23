"""Market invariants under long seeded random play with mixed scripted seats.

After every step: credits conserved, no negative budget or holdings, job progress and status
consistent, no block created or used twice, no resurrection, finite rewards that equal the sum of
their components. Per episode: trades are zero-sum and each lab's return decomposes into realised
job value plus its budget change (payments, trades, penalties) plus the shaping terms.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import make_seats, new_env, play

import scenarios
from agents.base import BaseAgent
from agents.registry import make_agent
from agents.scripted import truthful_bid
from market.core import ledger
from market.core.actions import (
    AcceptOffer,
    Bid,
    CommitToCoalition,
    Finish,
    FormCoalition,
    SendOffer,
    Wait,
)
from market.environment.aec import TALK_ACTIONS

SCENARIOS = scenarios.builtin_names()
BIDDERS = [
    "random_valid",
    "truthful",
    "always_accept",
    "spam_offers",
    "spam_coalitions",
    "spam_pitches",
    "short_seller",  # short sales (collateral, compensation) and pledges it cannot keep
]
DESIGNERS = ["fixed", "random"]


class Quitter(BaseAgent):
    """Plays like ``inner`` but finishes (leaves the market) with a small probability per turn."""

    name = "quitter"

    def __init__(self, inner: str = "random_valid", p: float = 0.03) -> None:
        super().__init__()
        self.inner, self.p = (Dealer() if inner == "dealer" else make_agent(inner)), p

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.inner.reset(None if seed is None else seed + 1)

    def act(self, obs: Any) -> Any:
        if "finish" in obs.legal_actions and self.rng.random() < self.p:
            return Finish()
        return self.inner.act(obs)


class Dealer(BaseAgent):
    """Exercises what the registry's scripted seats rarely do: forward contracts (sold ahead, some
    short with collateral, so a seller can end up short), accepting them, funded coalitions with
    block pledges and coalition bids by the leader."""

    name = "dealer"

    def act(self, obs: Any) -> Any:
        rng, me = self.rng, obs.seat
        others = [s for s in obs.active_labs if s != me]
        budget = obs.budget or 0.0
        if obs.phase == "negotiation":
            u = rng.random()
            if obs.offers_received and u < 0.5:
                return AcceptOffer(offer_id=obs.offers_received[0].offer_id)
            invited = [c for c in obs.coalitions or () if me in c.invited]
            if invited and u < 0.8:
                return CommitToCoalition(
                    coalition_id=invited[0].coalition_id, contribution=round(budget * 0.3, 2)
                )
            if others and u < 0.6:
                ahead = int(rng.integers(0, 3))
                delivery = min(obs.round + ahead, obs.rounds_total - 1)
                held = (obs.holdings or [0])[delivery - obs.round]
                side = "sell" if rng.random() < 0.7 else "buy"
                short = side == "sell" and delivery > obs.round and rng.random() < 0.5
                return SendOffer(
                    to=str(rng.choice(others)),
                    side=side,
                    blocks=max(1, held) + int(short),
                    price=round(float(rng.uniform(5, 60)), 2),
                    delivery_round=delivery,
                    expires_in=int(rng.integers(1, 3)),
                    short=short,
                )
            if others and u < 0.85:
                return FormCoalition(
                    members=[str(rng.choice(others))],
                    contribution=round(budget * 0.3, 2),
                    split=str(rng.choice(["proportional", "equal"])),
                    term_rounds=int(rng.integers(1, 3)),
                    pledge_blocks=int(rng.integers(0, 3)),
                )
            return Wait()
        if obs.phase == "bidding":
            led = [
                c
                for c in obs.coalitions or ()
                if c.leader == me and c.status == "active" and c.pool
            ]
            if led and rng.random() < 0.7:
                c = led[0]
                n = int(rng.integers(1, max(1, obs.capacity) + 1))
                bids = sorted((float(x) for x in rng.uniform(0, c.pool / n, n)), reverse=True)
                return Bid(bids=[round(b, 4) for b in bids], coalition_id=c.coalition_id)
            return truthful_bid(obs)
        return Wait()


def mixed_seats(env: Any, seed: int, quitters: bool = True) -> dict[str, Any]:
    """A seed-dependent mix of the scripted population (rotated specs, fixed/random designer),
    plus dealers (forward contracts, coalition bids) and a seat that may quit mid-episode."""
    k = seed % len(BIDDERS)
    rotated = BIDDERS[k:] + BIDDERS[:k]
    seats = make_seats(env, rotated, designer=DESIGNERS[seed % 2])
    n = len(seats) - ("designer_0" in seats)
    if seed % 4 != 3:
        for i in range(1, n, 2):
            seats[f"bidder_{i}"] = Dealer()
    if quitters and seed % 3 == 0:
        seats["bidder_0"] = Quitter(["random_valid", "truthful", "dealer"][seed % 9 // 3])
    return seats


class InvariantChecker:
    """Asserts the step invariants; call :meth:`after` after every ``env.step``."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.raw = env.unwrapped
        self.seen: set[str] = set()
        self.gone: set[str] = set()
        self.steps = 0
        self.errors: dict[str, int] = {}
        self.talks: dict[str, int] = {}
        self.components: dict[str, dict[str, float]] = {}
        self._start()

    def _start(self) -> None:
        raw = self.raw
        self.initial_holdings = raw.world.holdings.copy()
        self.initial_budgets = [lab.budget for lab in raw.world.labs]
        self.initial_credits = math.fsum(self.initial_budgets)
        assert not raw.world.blocks_issued.any() and raw.world.operator_credits == 0.0
        self.round = raw.round
        self.operator = raw.world.operator_credits
        self.external = raw.world.external_credits
        self.n_results = 0
        self.progress = self._progress()
        self.seen |= set(raw.agents)

    def _progress(self) -> np.ndarray:
        return np.array([sum(j.progress for j in lab.jobs) for lab in self.raw.world.labs])

    def before(self, turn: dict[str, Any]) -> None:
        # the reward last() returned is exactly the sum of the components in the seat's info
        comps = turn["info"].get("reward_components", {})
        assert isinstance(turn["reward"], float) and math.isfinite(turn["reward"])
        assert sum(comps.values()) == pytest.approx(turn["reward"], abs=1e-9), (
            turn["agent"],
            comps,
            turn["reward"],
        )
        for name, value in comps.items():
            bucket = self.components.setdefault(turn["agent"], {})
            bucket[name] = bucket.get(name, 0.0) + value

    def after(self, turn: dict[str, Any]) -> None:
        raw, w = self.raw, self.raw.world
        self.steps += 1
        agent = turn["agent"]
        if not turn["dead"]:
            info = raw.infos[agent]
            if "error" in info:
                self.errors[agent] = self.errors.get(agent, 0) + 1
                assert info["error"], "empty error message"
            elif info.get("action") in TALK_ACTIONS:
                self.talks[agent] = self.talks.get(agent, 0) + 1
        # credits conserved, counted here from the accounts themselves (every coalition's escrow,
        # dissolved ones included) and by the env's own audit; budgets and holdings never negative
        scale = max(1.0, self.initial_credits)
        escrow = math.fsum(
            b for c in raw.coalitions.coalitions.values() for b in c.balances.values()
        )
        # collateral of open short sales is escrowed too: its tally equals the contracts' sum
        open_collateral = math.fsum(c.collateral for c in raw.book.contracts if c.delivered < 0)
        assert w.collateral_held == pytest.approx(open_collateral, abs=1e-6), (
            w.collateral_held,
            open_collateral,
        )
        assert w.collateral_held >= -1e-9
        total = math.fsum(
            [lab.budget for lab in w.labs] + [escrow, w.operator_credits, w.collateral_held]
        )
        leak = total - self.initial_credits - w.external_credits
        assert abs(leak) <= 1e-6 * scale, f"credits not conserved: {leak}"
        assert abs(raw.credit_balance()) <= 1e-6 * scale, (
            f"credits not conserved: {raw.credit_balance()}"
        )
        # the operator only receives; credits enter or leave the market only with a budget shock
        # of a round that started during this step
        assert w.operator_credits >= self.operator - 1e-9, "the operator paid credits out"
        if w.external_credits != self.external:
            started = range(self.round + 1, raw.round + 1)
            assert any(
                sh.round in started and sh.kind in ("budget_cut", "windfall") for sh in raw.shocks
            ), (
                f"external credits changed by {w.external_credits - self.external} without a budget shock"
            )
        self.round, self.operator, self.external = raw.round, w.operator_credits, w.external_credits
        for lab in w.labs:
            assert lab.budget >= -1e-9, f"{lab.seat} budget {lab.budget}"
            assert 0.0 <= lab.reputation <= 1.0
        assert (w.holdings >= 0).all(), f"negative holdings:\n{w.holdings}"
        for c in raw.coalitions.coalitions.values():
            assert all(b >= -1e-9 for b in c.balances.values()), c
            if c.status == "dissolved":
                assert not c.balances, (
                    f"dissolved coalition {c.coalition_id} still holds {c.balances}"
                )
        # jobs
        for lab in w.labs:
            for j in lab.jobs:
                assert 0 <= j.progress <= j.size, j
                if j.status == "done":
                    assert j.progress == j.size and j.realized == j.value, j
                elif j.status == "pending":
                    assert j.progress == 0 and j.realized == 0.0, j
                elif j.status == "active":
                    assert j.progress < j.size, j
                    assert lab.active and j.arrival <= raw.round <= j.deadline, (
                        "live job out of its window",
                        raw.round,
                        j,
                    )
                else:
                    assert j.status == "expired", j
                    want = j.unit_value * j.progress if j.partial_credit else 0.0
                    assert j.realized == pytest.approx(want), j
        # blocks: future rounds untouched by the operator, cleared rounds got at most capacity
        progress = self._progress()
        gained = progress - self.progress
        assert (gained >= 0).all()
        new_results = raw.results[self.n_results :]
        if not new_results:
            assert (gained == 0).all(), "progress without a clearing"
        # blocks: each round's holdings are its endowments plus what the operator issued for it
        # (the ledger's tally), which is exactly that round's auction sales and judge grants,
        # less the blocks that failed at its close (each failure logged with the round)
        cleared = {r.round: r for r in raw.results}
        for col in range(raw.scenario.rounds):
            total = int(w.holdings[:, col].sum())
            issued = int(w.blocks_issued[col])
            failed = int(w.blocks_failed[col])
            assert total == int(self.initial_holdings[:, col].sum()) + issued - failed, (
                f"blocks created for round {col}"
            )
            logged = sum(len(f.slots) for f in cleared[col].failures) if col in cleared else 0
            assert failed == logged, (col, failed, logged)
            if col in cleared:
                r = cleared[col]
                granted = sum(v.granted for v in r.verdicts)
                assert issued == r.sold + granted <= r.capacity == int(w.capacity[col]), (
                    col,
                    issued,
                    r.sold,
                    granted,
                )
            else:
                assert issued == 0, f"blocks created for round {col} before its clearing"
        for r in new_results:
            # the progress of this clearing step ran on blocks the lab held that round
            assert len(new_results) == 1
            assert (gained <= w.holdings[:, r.round]).all(), (gained, w.holdings[:, r.round])
            for lab in w.labs:
                if not lab.active and lab.exit_round is not None and lab.exit_round < r.round:
                    assert gained[lab.index] == 0
        self.progress = progress
        self.n_results = len(raw.results)
        # seats: once removed never back; rewards finite; info components sum to the reward
        now = set(raw.agents)
        self.gone |= self.seen - now
        assert not (self.gone & now), f"resurrected: {self.gone & now}"
        self.seen |= now
        for a, rew in raw.rewards.items():
            assert isinstance(rew, float) and math.isfinite(rew), (a, rew)
        for a in raw.agents:
            comps = raw.infos[a].get("reward_components", {})
            assert all(math.isfinite(v) for v in comps.values())
            assert sum(comps.values()) == pytest.approx(raw._cumulative_rewards[a], abs=1e-9), (
                a,
                comps,
            )


def run_checked(
    scenario: str,
    seed: int,
    quitters: bool = True,
    seats: dict[str, Any] | None = None,
    **overrides: Any,
) -> tuple[Any, InvariantChecker, list]:
    env = new_env(scenario, **overrides)
    seats = seats or mixed_seats(env, seed, quitters)
    checker: InvariantChecker | None = None

    def before(turn: dict[str, Any]) -> None:
        nonlocal checker
        if checker is None:
            checker = InvariantChecker(env)
        checker.before(turn)

    turns = play(env, seats, seed, before_step=before, after_step=lambda t: checker.after(t))
    assert checker is not None and checker.steps == len(turns)
    return env, checker, turns


def check_returns(env: Any, checker: InvariantChecker, turns: list) -> None:
    """Zero-sum trades, and each lab's return rebuilt from the world state at the end."""
    raw = env.unwrapped
    sc = raw.scenario
    vu = sc.rewards.value_unit
    returns: dict[str, float] = {}
    for t in turns:
        returns[t["agent"]] = returns.get(t["agent"], 0.0) + t["reward"]
    trade = [
        checker.components.get(lab.seat, {}).get("trade_balance", 0.0) for lab in raw.world.labs
    ]
    assert sum(trade) == pytest.approx(0.0, abs=1e-9), trade
    compensation = [
        checker.components.get(lab.seat, {}).get("breach_compensation", 0.0)
        for lab in raw.world.labs
    ]
    assert sum(compensation) == pytest.approx(0.0, abs=1e-9), compensation
    assert raw.world.external_credits == 0.0
    for lab in raw.world.labs:
        seat = lab.seat
        comps = checker.components.get(seat, {})
        shaping = comps.get("invalid_action", 0.0) + comps.get("talk_cost", 0.0)
        assert comps.get("invalid_action", 0.0) == pytest.approx(
            -sc.rewards.invalid_action_penalty * checker.errors.get(seat, 0)
        )
        assert comps.get("talk_cost", 0.0) == pytest.approx(
            -sc.rewards.talk_cost * checker.talks.get(seat, 0)
        )
        realized = sum(j.realized for j in lab.jobs)
        budget_change = lab.budget - checker.initial_budgets[lab.index]
        expected = (realized + budget_change) / vu + shaping
        assert returns.get(seat, 0.0) == pytest.approx(expected, abs=1e-7), (
            seat,
            comps,
            realized,
            budget_change,
        )
        assert comps.get("job_value", 0.0) == pytest.approx(realized / vu, abs=1e-9), (seat, comps)
        assert not any(j.status == "active" for j in lab.jobs), (
            "a job is still live after the episode"
        )


# default run: a few dozen episodes per scenario, well under the time budget
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("chunk", range(3))
def test_step_invariants(scenario: str, chunk: int) -> None:
    for seed in range(chunk * 12, chunk * 12 + 12):
        run_checked(scenario, seed)


NO_BUDGET_SHOCKS = {"shock_rates__budget_cut": 0.0, "shock_rates__windfall": 0.0}
#: owned blocks never fail (tests that count blocks by hand)
NO_FAILURES = {"delivery__outage_exposure": 0.0, "delivery__reliability_exposure": 0.0}


def no_budget_shocks(scenario: str) -> dict[str, Any]:
    """Overrides that remove random and scheduled budget cuts and windfalls (credits from outside)."""
    kept = [
        s.model_dump()
        for s in scenarios.load_scenario(scenario).shocks
        if s.kind not in ("budget_cut", "windfall")
    ]
    return {**NO_BUDGET_SHOCKS, "shocks": kept}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_returns_decompose(scenario: str) -> None:
    for seed in range(20):
        env, checker, turns = run_checked(scenario, seed, **no_budget_shocks(scenario))
        check_returns(env, checker, turns)


def test_delivery_risk_runs_under_the_invariant_checks() -> None:
    """The checked sweep is not vacuous for delivery risk: across a few coalition_market
    episodes, blocks fail, collateral is posted and paid out as compensation, and pledges
    default, all while every step invariant (credits with collateral, blocks less failures)
    and the return decomposition hold."""
    seen = {"failed": 0, "collateral": 0, "compensation": 0, "defaults": 0}
    for seed in range(6):
        env, checker, turns = run_checked(
            "coalition_market", seed, quitters=False, **no_budget_shocks("coalition_market")
        )
        check_returns(env, checker, turns)
        for r in env.unwrapped.results:
            seen["failed"] += sum(len(f.slots) for f in r.failures)
            seen["collateral"] += sum(1 for b in r.breaches if b.contract.collateral > 0)
            seen["compensation"] += sum(1 for b in r.breaches if b.compensation > 0)
            seen["defaults"] += sum(len(p.defaults) for p in r.pools)
    assert all(seen.values()), seen


def test_entrant_jobs_are_never_overdue_on_entry() -> None:
    """A late entrant's jobs arrive no earlier than it enters, with their deadline still ahead.

    Regression: a job drawn to arrive in round 1 for a lab entering in round 4 used to become
    active on entry with its deadline already past (judge urgency divided by zero; value earned
    after the deadline)."""
    checked = 0
    for seed in range(600):
        env = new_env("coalition_market", wrapped=False)
        env.reset(seed=seed)
        w = env.world
        for lab in w.labs:
            entry = int(w.entry_round[lab.index])
            if entry > 0:
                checked += 1
                for j in lab.jobs:
                    assert entry <= j.arrival <= j.deadline, (seed, lab.seat, entry, j)
    assert checked >= 600


class Script(BaseAgent):
    """Plays ``steps`` [(round, phase, action dict)] in order, one per matching turn; else ``inner``."""

    name = "script"

    def __init__(
        self, steps: list[tuple[int, str, dict[str, Any]]], inner: str = "truthful"
    ) -> None:
        super().__init__()
        self.steps, self.inner = list(steps), make_agent(inner)

    def act(self, obs: Any) -> Any:
        if self.steps and self.steps[0][:2] == (obs.round, obs.phase):
            return json.dumps(self.steps.pop(0)[2])
        return self.inner.act(obs)


@pytest.mark.parametrize("leaver", ["seller", "buyer"])
def test_leaving_with_an_open_forward_contract(leaver: str) -> None:
    """A seat that finishes while a forward contract it is party to is still open: credits and
    blocks stay conserved, trades zero-sum, and the seller's delivery/penalty is accounted to it
    while it still has a seat (regression: a seller that had left was charged a breach refund and
    penalty that no reward ever reported, although it held the blocks)."""
    overrides = {
        **NO_BUDGET_SHOCKS,
        **NO_FAILURES,
        "labs__endowment": [2, 2],
        "labs__endowment_rounds": 5,
    }
    env = new_env("market_round", **overrides)
    seats = make_seats(env, ["truthful"])
    sale = {
        "action_type": "send_offer",
        "to": "bidder_1",
        "blocks": 2,
        "price": 30.0,
        "delivery_round": 2,
    }
    quitter = 0 if leaver == "seller" else 1
    seats["bidder_0"] = Script(
        [(0, "negotiation", sale)]
        + ([(1, "negotiation", {"action_type": "finish"})] if quitter == 0 else [])
    )
    seats["bidder_1"] = Script(
        [(0, "negotiation", {"action_type": "accept_offer", "offer_id": "o0"})]
        + ([(1, "negotiation", {"action_type": "finish"})] if quitter == 1 else [])
    )
    env, checker, turns = run_checked("market_round", 4, seats=seats, **overrides)
    raw = env.unwrapped
    assert raw.world.labs[quitter].exit_round == 1 and checker.errors == {}
    assert "withdrawal_penalty" not in checker.components["bidder_0"], (
        "the seller held the blocks: no breach"
    )
    assert raw.world.holdings[0, 2] == 0 and raw.world.holdings[1, 2] >= 4  # delivered
    check_returns(env, checker, turns)


def test_invariant_checker_catches_a_leak() -> None:
    """The checker is not vacuous: a credit leak, a phantom block and excess progress all fail."""
    env = new_env("market_round")
    env.reset(seed=3)
    checker = InvariantChecker(env)
    turn = {"agent": env.agent_selection, "dead": False}
    raw = env.unwrapped
    raw.world.labs[0].budget += 1.0
    with pytest.raises(AssertionError, match="credits"):
        checker.after(turn)
    raw.world.labs[0].budget -= 1.0
    raw.world.operator_credits += 1.0  # credits from nowhere into the operator's account
    with pytest.raises(AssertionError, match="credits not conserved"):
        checker.after(turn)
    raw.world.operator_credits -= 1.0
    raw.world.external_credits += 1.0  # an injection booked without a budget shock
    raw.world.labs[0].budget += 1.0
    with pytest.raises(AssertionError, match="without a budget shock"):
        checker.after(turn)
    raw.world.external_credits -= 1.0
    raw.world.labs[0].budget -= 1.0
    raw.world.holdings[1, 3] += 1
    with pytest.raises(AssertionError, match="blocks created"):
        checker.after(turn)
    raw.world.blocks_issued[3] += 1  # issued by the tally, but round 3 has not cleared yet
    with pytest.raises(AssertionError, match="before its clearing"):
        checker.after(turn)
    raw.world.blocks_issued[3] -= 1
    raw.world.holdings[1, 3] -= 1
    checker.after(turn)  # all restored: passes again
    job = raw.world.labs[0].jobs[0]
    job.progress = job.size + 1
    with pytest.raises(AssertionError):
        checker.after(turn)


def test_ledger_moves_by_hand() -> None:
    """Each ledger function debits one account and credits another by the same amount (figures
    chosen exact in binary, so the checks are equalities)."""
    env = new_env("market_round", wrapped=False, labs__count=2, labs__entrants=0)
    env.reset(seed=0)
    w = env.world
    w.labs[0].budget, w.labs[1].budget = 100.0, 50.0
    held = w.holdings.copy()

    def total() -> float:
        return (
            w.labs[0].budget
            + w.labs[1].budget
            + sum(balances.values())
            + w.operator_credits
            - w.external_credits
        )

    balances: dict[int, float] = {}
    ledger.transfer_credits(w, 0, 1, 30.0)
    assert (w.labs[0].budget, w.labs[1].budget, total()) == (70.0, 80.0, 150.0)
    assert ledger.pay_operator(w, 1, 100.0) == 80.0  # a penalty is capped at the budget
    assert (w.labs[1].budget, w.operator_credits, total()) == (0.0, 80.0, 150.0)
    ledger.pay_for_blocks(w, 0, 1, 2, 20.0)
    assert (w.labs[0].budget, w.operator_credits, total()) == (50.0, 100.0, 150.0)
    assert w.holdings[0, 1] == held[0, 1] + 2 and w.blocks_issued.tolist()[:2] == [0, 2]
    ledger.mint_credits(w, 1, 40.0)
    ledger.burn_credits(w, 0, 10.0)
    assert (w.labs[0].budget, w.labs[1].budget, w.external_credits, total()) == (
        40.0,
        40.0,
        30.0,
        150.0,
    )
    ledger.escrow_credits(w, balances, 0, 30.0)
    ledger.escrow_credits(w, balances, 1, 10.0)
    assert (w.labs[0].budget, w.labs[1].budget, balances, total()) == (
        10.0,
        30.0,
        {0: 30.0, 1: 10.0},
        150.0,
    )
    shares = ledger.pay_operator_from_escrow(w, balances, [0, 1], 20.0, 40.0)
    assert shares == {0: 15.0, 1: 5.0} and balances == {0: 15.0, 1: 5.0}
    assert (w.operator_credits, total()) == (120.0, 150.0)
    assert ledger.release_escrow(w, balances, 0) == 15.0
    assert (w.labs[0].budget, balances, total()) == (25.0, {1: 5.0}, 150.0)
    ledger.issue_blocks(w, 1, 0, 3)
    ledger.move_blocks(w, 1, 0, 0, 2)
    assert w.holdings[:, 0].tolist() == [held[0, 0] + 2, held[1, 0] + 1] and w.blocks_issued[0] == 3


# Writes to the ledger's accounts outside market/core/ledger.py that are not credit or block
# movements: the LLM seats' spend budgets (a different ``budget``) and the world's construction at
# reset, before the opening balance the audits start from.
NOT_MOVEMENTS = {
    ("market/run/rollout.py", "agent.budget"),
    ("agents/llm/agent.py", "self.budget"),
    ("market/core/shocks.py", "world.holdings[s.target, :s.round]"),
}
ACCOUNTS = {
    "budget",
    "operator_credits",
    "external_credits",
    "blocks_issued",
    "holdings",
    "balances",
}
MUTATORS = {"pop", "popitem", "clear", "update", "setdefault", "fill", "put", "itemset", "resize"}


def _account_writes(path: str, tree: ast.AST) -> list[str]:
    """Targets of assignments, deletions and mutating calls that touch a ledger account."""

    def account(node: ast.expr) -> bool:
        while isinstance(node, ast.Subscript):
            node = node.value
        return isinstance(node, ast.Attribute) and node.attr in ACCOUNTS

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "np.add.at",
            "np.subtract.at",
            "np.copyto",
        ):
            targets = node.args[:1]
        else:
            continue
        for t in targets:
            for leaf in t.elts if isinstance(t, ast.Tuple | ast.List) else [t]:
                if account(leaf) and (path, ast.unparse(leaf)) not in NOT_MOVEMENTS:
                    found.append(f"{path}:{node.lineno}: {ast.unparse(leaf)}")
    return found


def test_only_the_ledger_moves_credits_and_blocks() -> None:
    """No module but market/core/ledger.py writes a budget, the operator's or external credits, a
    coalition's escrow or block holdings, so every movement has a source and a sink."""
    root = Path(__file__).resolve().parents[2]
    found, scanned = [], 0
    for package in ("market", "agents", "scenarios"):
        for file in sorted((root / package).rglob("*.py")):
            path = file.relative_to(root).as_posix()
            if path == "market/core/ledger.py":
                continue
            scanned += 1
            found += _account_writes(path, ast.parse(file.read_text(encoding="utf-8")))
    assert scanned > 30
    assert not found, "credits or blocks moved outside market.core.ledger:\n" + "\n".join(found)
    # and the scan is not vacuous: it sees the kinds of writes the ledger itself makes
    ledger_writes = _account_writes(
        "market/core/ledger.py",
        ast.parse((root / "market/core/ledger.py").read_text(encoding="utf-8")),
    )
    assert len(ledger_writes) >= 12, ledger_writes
    sneaky = "lab.budget -= x\nworld.holdings[i, r] += 1\ncoalition.balances.pop(i)\nw.operator_credits = 0.0\n"
    assert len(_account_writes("market/x.py", ast.parse(sneaky))) == 4


def _reputation_writes(path: str, tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AugAssign | ast.AnnAssign)
            else []
        )
        for t in targets:
            for leaf in t.elts if isinstance(t, ast.Tuple | ast.List) else [t]:
                if isinstance(leaf, ast.Attribute) and leaf.attr == "reputation":
                    found.append(f"{path}:{node.lineno}: {ast.unparse(leaf)}")
    return found


def test_only_lose_reputation_writes_a_reputation() -> None:
    """A lab's reputation changes only through market.core.world.lose_reputation, which moves
    ``world.reputation_version``: the observation cache rebuilds the reputations every seat sees
    only when that version moves, so a write anywhere else would leave stale views."""
    root = Path(__file__).resolve().parents[2]
    found = []
    for package in ("market", "agents", "scenarios"):
        for file in sorted((root / package).rglob("*.py")):
            path = file.relative_to(root).as_posix()
            found += _reputation_writes(path, ast.parse(file.read_text(encoding="utf-8")))
    assert len(found) == 1 and found[0].startswith("market/core/world.py:"), found
    assert found[0].endswith(": entry.reputation")  # inside lose_reputation
    sneaky = "lab.reputation = 0.5\nw.labs[0].reputation -= 0.1\na, b.reputation = 1, 2\n"
    assert len(_reputation_writes("market/x.py", ast.parse(sneaky))) == 3


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_step_invariants_soak(scenario: str) -> None:
    for seed in range(100, 250):
        env, checker, turns = run_checked(scenario, seed)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_returns_decompose_soak(scenario: str) -> None:
    for seed in range(1000, 1080):
        env, checker, turns = run_checked(scenario, seed, **no_budget_shocks(scenario))
        check_returns(env, checker, turns)
