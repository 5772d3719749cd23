"""The rules an LLM seat is taught, generated from its own observation.

Rule: every sentence describes the market as this seat sees it now and every number in it is read
from the observation (or from the market's fixed rules in :mod:`market.core.penalties`); nothing
is invented. Only the auction in force is explained (one sentence), the reserve as the seat sees it
(hidden or its effective value), what a block is worth to the seat's jobs (the marginal values of
:func:`market.environment.marginal_values`), each live job's deadline and credit rule, and what
commitments and penalties cost. The designer is taught what each mechanism field does, what its
reward measures, and that ``wait`` keeps the mechanism in force.

Examples are built from the seat's own state (a bid example is its own marginal values, cut to its
budget) or left out, so no fixed number in a prompt can anchor a model.
"""

from __future__ import annotations

import json
from typing import Any

from market.core.penalties import (
    BREACH_REPUTATION_LOSS,
    COALITION_EXIT_REPUTATION_LOSS,
    FALSE_CLAIM_REPUTATION_LOSS,
)
from market.core.summation import ordered_sum
from market.environment import JobView, Observation, affordable, marginal_values

#: jobs described one by one in the rules; the rest are counted ("... N more")
MAX_JOB_LINES = 3
#: marginal values listed; the rest are counted
MAX_VALUES = 6

AUCTION_RULES = {
    "first_price": (
        "first_price (pay-as-bid): each block you win costs your own bid for it, so a bid at your "
        "full value gains nothing; bid below value."
    ),
    "second_price": (
        "second_price (uniform price): every block sold costs the same price, the highest rejected "
        "bid at or above the reserve (else the reserve); bidding your true values is safe."
    ),
    "vcg": (
        "vcg: a winner pays the bids its blocks displaced (its externality), at least the reserve "
        "per block and never more than its own bids; bidding your true values is best."
    ),
    "fair_share": (
        "fair_share: blocks are split max-min fairly by how many of your bids clear the reserve, "
        "each at the reserve; bid levels above the reserve do not matter, only the count."
    ),
    "posted_price": (
        "posted_price: every block bid for at or above the reserve costs the reserve; when more "
        "are wanted than sold, a lottery picks which bids are served."
    ),
}

#: what each mechanism field does, for the designer (docs/mechanisms.md)
MECHANISM_FIELDS = {
    "auction_type": "how blocks clear: first_price, second_price, vcg, fair_share or posted_price",
    "reserve_price": "no bid below max(reserve_price, operator floor) is eligible",
    "reveal_reserve": "bidders see the reserve",
    "reveal_competing_bids": "after clearing everyone sees all bid schedules",
    "reveal_winner_identity": "bidders see who won how many blocks",
    "reveal_clearing_price": "bidders see the price",
    "reveal_bid_distribution": "everyone sees summary statistics of all bids",
    "shill_penalty": "credits per flagged block of a shill bid",
    "withdrawal_penalty": (
        "credits for leaving a coalition before its term, and per undelivered forward block"
    ),
    "collusion_penalty": "credits per round for each member of a flagged cartel",
    "coalition_policy": (
        "allow, restrict (no joint bids), penalize_suspected or penalize_confirmed (cartel fines)"
    ),
    "judge_pool_share": "fraction of capacity the judge grants free to pitching labs",
}


def num(x: float) -> str:
    """A number as a prompt shows it: at most 2 decimals, no trailing zeros."""
    return f"{round(float(x), 2):g}"


def value_runs(values: list[float]) -> str:
    """A non-increasing schedule as runs, first block first: ``38.55 x2, then 31.25 x5``."""
    runs: list[list[Any]] = []
    for v in values:
        text = num(v)
        if runs and runs[-1][0] == text:
            runs[-1][1] += 1
        else:
            runs.append([text, 1])
    shown = [f"{text} x{count}" if count > 1 else text for text, count in runs[:MAX_VALUES]]
    if len(runs) > MAX_VALUES:
        shown.append(f"... {ordered_sum(c for _, c in runs[MAX_VALUES:])} more blocks")
    return ", then ".join(shown)


def auction_rule(obs: Observation) -> str:
    """One sentence: how the auction in force clears."""
    kind = obs.mechanism.auction_type
    return "Auction in force: " + AUCTION_RULES.get(kind, f"{kind}.")


def reserve_rule(obs: Observation) -> str:
    """What the reserve is this round, as far as the seat can see it."""
    floor = obs.energy_floor
    reserve = obs.mechanism.reserve_price
    if reserve is None:
        return (
            f"The reserve is hidden; a bid below it (or below the operator floor {num(floor)}) "
            "is ignored."
        )
    if floor > reserve:
        return (
            f"Reserve: bids below {num(floor)} credits a block are ignored (the operator floor "
            f"{num(floor)} is above the reserve {num(reserve)})."
        )
    return f"Reserve: bids below {num(reserve)} credits a block are ignored."


def job_line(job: JobView, obs: Observation) -> str:
    """One live job: blocks left, due round, worth of a block, credit rule, whether it can run."""
    runs = (
        ""
        if job.min_reliability <= obs.reliability
        else f", cannot run now (needs reliability {num(job.min_reliability)})"
    )
    credit = "partial credit" if job.partial_credit else "all or nothing"
    return (
        f"- {job.job_id}: {job.size - job.progress}/{job.size} blocks left, due round "
        f"{job.deadline}, {num(job.value / job.size)} a block, {credit}{runs}"
    )


def bid_example(obs: Observation) -> str:
    """A bid built from the seat's own marginal values, cut to its budget ('' when none)."""
    if obs.role != "bidder" or "bid" not in obs.legal_actions:
        return ""
    values = affordable(marginal_values(obs)[:MAX_VALUES], obs.budget or 0.0, MAX_VALUES)
    bids = [round(v, 2) for v in values]
    return json.dumps({"action_type": "bid", "bids": bids}, separators=(",", ":"))


def bidder_rules(obs: Observation) -> list[str]:
    """The rules a lab is taught, from its observation."""
    lines = [
        "Your reward: the value of the jobs you finish by their deadlines minus the credits you pay"
        f" ({num(obs.value_unit)} credits = 1 reward unit); invalid actions and talk cost a little.",
        f"Each block runs with probability {num(obs.reliability)}; a failed block must be run again."
        " Blocks go to your jobs earliest deadline first unless you use allocate_to_job.",
        auction_rule(obs),
        reserve_rule(obs),
    ]
    if "bid" in obs.legal_actions:
        lines.append(
            "A bid lists one price per block wanted, highest first (non-increasing), summing to at "
            f"most your budget ({num(obs.budget or 0.0)}); bids [] abstains."
        )
    values = marginal_values(obs)
    if values:
        lines.append(
            f"What each extra block is worth to you this round: {value_runs(values)} credits; "
            "paying more than that loses money."
        )
    else:
        lines.append("No extra block is worth anything to your jobs this round.")
    live = sorted(
        (j for j in (obs.jobs or ()) if j.status == "active"), key=lambda j: (j.deadline, j.job_id)
    )
    if live:
        lines.append(
            "Your live jobs (all or nothing: unfinished by its deadline, pays nothing and gives "
            "back what it earned):"
        )
        lines += [job_line(j, obs) for j in live[:MAX_JOB_LINES]]
        if len(live) > MAX_JOB_LINES:
            lines.append(f"- ... {len(live) - MAX_JOB_LINES} more live jobs")
    m = obs.mechanism
    lines.append(
        "Commitments: a forward seller short of blocks refunds, pays "
        f"{num(m.withdrawal_penalty)} a block short and loses {num(BREACH_REPUTATION_LOSS)} "
        "reputation x the share short; leaving a coalition before its term: "
        f"{num(m.withdrawal_penalty)} and {num(COALITION_EXIT_REPUTATION_LOSS)} reputation; a "
        f"false pitch claim: {num(FALSE_CLAIM_REPUTATION_LOSS)} reputation."
    )
    fines = []
    if m.shill_penalty > 0:
        fines.append(f"{num(m.shill_penalty)} per shill block (bidding for more than you need)")
    if m.collusion_penalty > 0 and m.coalition_policy.startswith("penalize"):
        fines.append(f"{num(m.collusion_penalty)} per round per member of a flagged cartel")
    if fines:
        lines.append("Fines in force: " + "; ".join(fines) + ".")
    if m.coalition_policy == "restrict":
        lines.append("Joint (coalition) bids are forbidden now.")
    return lines


def designer_rules(obs: Observation) -> list[str]:
    """The rules the market operator is taught, from its observation."""
    current = obs.mechanism.model_dump()
    fields = [
        f"- {name} (now {json.dumps(current[name])}): {what}"
        for name, what in MECHANISM_FIELDS.items()
        if name in current
    ]
    return [
        "Your reward each round: welfare_ratio x fairness x participation x stability (each 0..1),"
        " plus a weight times revenue; the series so far are under 'Market health'.",
        auction_rule(obs),
        "Mechanism fields:",
        *fields,
        "The mechanism stays in force until you change it: wait keeps it. set_mechanism changes"
        " only the fields you name; name each field you want to change with its new value.",
    ]


def seat_rules(obs: Observation) -> list[str]:
    """The rule lines of the seat's system prompt (see the module docstring)."""
    return designer_rules(obs) if obs.role == "designer" else bidder_rules(obs)
