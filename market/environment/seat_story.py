"""The sentences of a seat's story and screen (:mod:`market.environment.seat_guide` uses them).

Rules: pure functions of the seat's own observations (never the env), so a person is told
only what the seat may see; plain sentences with no markup and no Python reprs; numbers as a
person reads them (credits with two decimals, rounds by their number, blocks labelled by round);
text another seat wrote is passed on in double quotes, as written, for the display to show as
plain text. Money is in credits; rewards are in reward units (credits / ``value_unit``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

from market.core.summation import ordered_sum
from market.environment.observations import (
    CoalitionView,
    ContractView,
    JobView,
    LastActionView,
    MarketResultView,
    MessageView,
    Observation,
    OfferView,
    ShockView,
)


# --- words -------------------------------------------------------------------------------------
def money(x: float | None) -> str:
    return "hidden" if x is None else f"{x:,.2f}"


def count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def quoted(text: str) -> str:
    """Another seat's text in double quotes, on one line (as written otherwise)."""
    return '"' + " ".join(text.split()) + '"'


def words(name: str) -> str:
    """An identifier in words: ``second_price`` -> ``second price``."""
    return name.replace("_", " ")


def who(seat: str, me: str) -> str:
    return "you" if seat == me else seat


def offer_words(o: OfferView, me: str) -> str:
    """An offer from ``me``'s side, e.g. ``bidder_1 offers to sell you 2 blocks for round 1 for
    60.00 credits in total (30.00 a block)``."""
    what = (
        f"{count(o.blocks, 'block')} for round {o.delivery_round} for {money(o.price)} credits "
        f"in total ({money(o.price / max(1, o.blocks))} a block)"
    )
    short = ", sold short" if o.short else ""
    if o.sender == me:
        return f"you offer to {o.side} {'to' if o.side == 'sell' else 'from'} {o.recipient} {what}{short}"
    verb = "sell you" if o.side == "sell" else "buy from you"
    return f"{o.sender} offers to {verb} {what}{short}"


def job_words(j: JobView) -> str:
    """A job in one sentence: what it still needs and pays, or how it ended."""
    if j.status == "done":
        return f"Job {j.job_id} is done: it earned {money(j.value)} credits."
    if j.status == "expired":
        kept = (
            f", keeping {money(j.value / max(1, j.size) * j.progress)} credits"
            if j.partial_credit
            else ""
        )
        return f"Job {j.job_id} expired after round {j.deadline} with {j.progress} of {j.size} blocks run{kept}."
    left = j.size - j.progress
    pay = "pays per block run" if j.partial_credit else "pays only if finished"
    return (
        f"Job {j.job_id} needs {count(left, 'more block')} by round {j.deadline}: "
        f"{count(j.size, 'block')} worth {money(j.value)} credits "
        f"({money(j.value / max(1, j.size))} a block), {pay}, runs only at reliability "
        f"{j.min_reliability:.2f} or better."
    )


def contract_words(c: ContractView, me: str) -> str:
    if c.seller == me:
        deal = f"you deliver {count(c.blocks, 'block')} of round {c.delivery_round} to {c.buyer}"
    else:
        deal = f"{c.seller} delivers you {count(c.blocks, 'block')} of round {c.delivery_round}"
    short = f" ({c.short} sold short, {money(c.collateral)} collateral)" if c.short else ""
    return f"Contract {c.contract_id}: {deal}, paid {money(c.price)} credits{short}."


def coalition_words(c: CoalitionView, me: str) -> str:
    parts = [
        f"Coalition {c.coalition_id} ({c.status}), led by {who(c.leader, me)}",
        "members " + ", ".join(who(m, me) for m in c.members),
    ]
    if c.invited:
        parts.append("invited " + ", ".join(who(m, me) for m in c.invited))
    parts.append(f"blocks split {'equally' if c.split == 'equal' else 'by contribution'}")
    parts.append(f"term to round {c.term_end}")
    if c.pool is not None:
        parts.append(f"pool {money(c.pool)} credits, yours {money(c.my_balance or 0.0)}")
    text = "; ".join(parts) + "."
    return text + (f" Purpose: {quoted(c.purpose)}." if c.purpose else "")


def result_words(r: MarketResultView, designer: bool = False) -> str:
    """The auction of ``r.round`` in one sentence, as far as it was revealed."""
    price = "" if r.clearing_price is None else f" at {money(r.clearing_price)} a block"
    text = f"The round {r.round} auction ({words(r.auction_type)}) sold {count(r.blocks_sold, 'block')}{price}."
    if r.winners:
        text += " Winners: " + ", ".join(f"{s} {n}" for s, n in r.winners.items()) + "."
    if r.judge_grants:
        text += " Judge grants: " + ", ".join(f"{s} {n}" for s, n in r.judge_grants.items()) + "."
    if not designer:
        text += (
            f" You won {count(r.my_won, 'block')} and paid {money(r.my_paid)} credits."
            if r.my_won
            else " You won no block."
        )
    return text


def message_words(m: MessageView, me: str) -> str:
    if m.to == "all" or m.to == ["all"]:
        to = "everyone"
    else:
        seats = [m.to] if isinstance(m.to, str) else m.to
        to = ", ".join(who(s, me) for s in seats)
    sender = "You" if m.sender == me else m.sender
    return f"{sender} to {to} (round {m.round}): {quoted(m.text)}"


_DONE = {
    "send_offer": "offer {offer_id} is open",
    "counter_offer": "your counter-offer {offer_id} is open and offer {countered} is closed",
    "reject_offer": "offer {offer_id} is now {status}",
    "form_coalition": "coalition {coalition_id} is proposed; it becomes active when an invitee commits",
    "commit_to_coalition": "you are in coalition {coalition_id} ({status})",
    "make_pitch": "your pitch for {pitched} block(s) goes to the judge",
    "counter_pitch": "your counter-pitch against {countered}'s pitch is recorded",
    "allocate_to_job": "job {job_id} gets up to {blocks} of your blocks first this round",
    "finish": "you have left the market for the rest of the episode",
    "set_mechanism": "the new rules are in force",
}


def verdict(last: LastActionView) -> str:
    """What the env said about the seat's last action, in one or two plain sentences."""
    what = last.action_type or "action (it could not be read)"
    if not last.accepted:
        return (
            f"The market refused your {what}: {last.error}. It cost you a penalty of "
            f"{last.penalty:g} reward; nothing else changed."
        )
    if last.action_type == "wait":
        return "You waited."
    r = {
        k: v if isinstance(v, str | int | float) else json.dumps(v)
        for k, v in (last.result or {}).items()
    }
    kind = last.action_type or ""
    note = ""
    if kind == "accept_offer":
        if r.get("status") == "void":
            note = f"but offer {r.get('offer_id')} was void: its sender can no longer honour it, so nothing changed hands"
        else:
            contract = f" (forward contract {r['contract_id']})" if r.get("contract_id") else ""
            note = f"the trade of offer {r.get('offer_id')} is done{contract}"
    elif kind == "bid":
        pool = f" for coalition {r['coalition_id']}" if r.get("coalition_id") else ""
        units = int(r.get("units", 0))
        note = f"your bid for {count(units, 'block')}{pool} is in" if units else "you bid nothing"
    elif kind == "leave_coalition":
        fee = float(r.get("breach_penalty", 0.0))
        note = f"you left coalition {r.get('coalition_id')}" + (
            f", paying a breach penalty of {money(fee)} credits" if fee else ""
        )
    elif kind == "send_message":
        sent = (last.result or {}).get("delivered_to")
        note = "delivered to " + (
            ", ".join(map(str, sent)) if isinstance(sent, list) else "everyone"
        )
    elif kind in ("reserve_capacity", "release_capacity"):
        verb = "reserved" if kind == "reserve_capacity" else "released"
        moved = (last.result or {}).get(verb)
        rounds = moved.items() if isinstance(moved, dict) else ()
        note = f"{verb} " + ", ".join(
            f"{count(int(str(n)), 'block')} of round {b[1:]}" for b, n in rounds
        )
    elif kind in _DONE:
        try:
            note = _DONE[kind].format(**r)
        except (KeyError, IndexError):
            note = ""
    return f"The market accepted your {what}" + (f": {note}." if note else ".")


# --- the story between two turns ---------------------------------------------------------------
def story(
    previous: Observation | None,
    current: Observation,
    rewards: Mapping[str, float] | None = None,
) -> list[str]:
    """Plain sentences of what happened between the seat's ``previous`` turn and ``current``
    (None: its first turn), as far as the seat may see it: the verdict on its last action, the
    auction's result, the new round, rule changes, labs entering and leaving, shocks, messages,
    pitches, offers to it and what became of its offers, contracts, coalition changes, its
    budget, blocks and jobs; then ``rewards`` (component -> reward units since the last turn)."""
    lines = [verdict(current.last_action)] if current.last_action is not None else []
    if previous is not None:
        lines += _market_news(previous, current)
        if current.role == "bidder":
            lines += _offer_news(previous, current)
            lines += _coalition_news(previous, current)
            lines += _own_news(previous, current)
    if rewards:
        lines += reward_words(rewards, current.value_unit)
    return lines


def reward_words(rewards: Mapping[str, float], value_unit: float) -> list[str]:
    """The seat's rewards by component, e.g. ``Your reward since your last turn: +0.42 (job
    value +0.60, trade balance -0.18).``"""
    parts = [f"{words(k)} {v:+.2f}" for k, v in rewards.items() if abs(v) >= 5e-5]
    if not parts:
        return []
    total = ordered_sum(rewards.values())
    return [
        f"Your reward since your last turn: {total:+.2f} ({', '.join(parts)}); a reward of 1 "
        f"is {value_unit:g} credits."
    ]


def _market_news(prev: Observation, cur: Observation) -> list[str]:
    me, lines = cur.seat, []
    if cur.round != prev.round:
        r = cur.last_result
        if r is not None and (prev.last_result is None or prev.last_result.round != r.round):
            lines.append(result_words(r, cur.role == "designer"))
        if cur.delivery is not None and cur.delivery.failed_last_round:
            lines.append(
                f"{count(cur.delivery.failed_last_round, 'block')} of yours failed last round "
                "(they ran nothing)."
            )
        stats = cur.designer_stats
        if stats is not None and stats.welfare_ratio:
            lines.append(health_words(cur))
        lines.append(
            f"Round {cur.round} began: {count(cur.capacity, 'block')} for sale, reliability "
            f"{cur.reliability:.2f}, floor price {money(cur.energy_floor)}."
        )
    before, after = prev.mechanism.model_dump(), cur.mechanism.model_dump()
    changed = [f"{words(k)} {before[k]} -> {v}" for k, v in after.items() if before.get(k) != v]
    if changed:
        lines.append("The rules changed: " + ", ".join(changed) + ".")
    lines += [f"{s} entered the market." for s in cur.active_labs if s not in prev.active_labs]
    lines += [f"{s} left the market." for s in prev.active_labs if s not in cur.active_labs]
    known = {(s.kind, s.round, s.target) for s in prev.shocks}
    lines += [shock_words(s, me) for s in cur.shocks if (s.kind, s.round, s.target) not in known]
    seen = Counter((m.sender, str(m.to), m.text, m.round) for m in prev.messages)
    for m in cur.messages:
        key = (m.sender, str(m.to), m.text, m.round)
        if seen[key]:
            seen[key] -= 1
        elif m.sender != me:
            lines.append(message_words(m, me))
    pitched = (
        {(p.lab, p.text): len(p.counters) for p in prev.pitches} if prev.round == cur.round else {}
    )
    for p in cur.pitches:
        old = pitched.get((p.lab, p.text))
        if old is None and p.lab != me:
            lines.append(
                f"{p.lab} asked the judge for {count(p.blocks_requested, 'block')}: {quoted(p.text)}"
            )
        for counter in p.counters[old or 0 :]:
            author, _, text = counter.partition(": ")
            if author != me:
                lines.append(f"{author} disputed {who(p.lab, me)}'s pitch: {quoted(text)}")
    return lines


_THEIR = {
    "accepted": "{them} accepted your offer {id}: {what}.",
    "rejected": "{them} rejected your offer {id}.",
    "countered": "{them} countered your offer {id} with new terms.",
    "void": "{them} tried to accept your offer {id}, but you could no longer honour it: it is void.",
    "withdrawn": "You withdrew your offer {id}.",
}
_TO_ME = {
    "withdrawn": "{them} withdrew offer {id}.",
    "void": "Offer {id} from {them} is void: its sender could no longer honour it.",
}


def _offer_news(prev: Observation, cur: Observation) -> list[str]:
    me, lines = cur.seat, []
    mine = cur.last_action.result if cur.last_action is not None else None
    own_ids = {str(v) for k, v in (mine or {}).items() if k in ("offer_id", "countered")}
    closed_before = {(o.offer_id, o.status) for o in prev.closed_offers or ()}
    closed_now = {o.offer_id for o in cur.closed_offers or ()}
    for o in cur.closed_offers or ():
        if (o.offer_id, o.status) in closed_before or o.offer_id in own_ids:
            continue
        table, them = (_THEIR, o.recipient) if o.sender == me else (_TO_ME, o.sender)
        text = table.get(o.status, "Offer {id} is now " + o.status + ".")
        lines.append(text.format(them=them, id=o.offer_id, what=offer_words(o, me)))
    open_now = {o.offer_id for o in [*(cur.offers_received or ()), *(cur.offers_sent or ())]}
    for o in [*(prev.offers_received or ()), *(prev.offers_sent or ())]:
        if (
            o.offer_id not in open_now
            and o.offer_id not in closed_now
            and o.offer_id not in own_ids
        ):
            lines.append(f"Offer {o.offer_id} expired unanswered ({offer_words(o, me)}).")
    had = {o.offer_id for o in prev.offers_received or ()}
    for o in cur.offers_received or ():
        if o.offer_id not in had:
            note = f" Their note: {quoted(o.message)}" if o.message else ""
            lines.append(
                f"New offer {o.offer_id}: {offer_words(o, me)}, open until the end of round "
                f"{o.expires_round}.{note}"
            )
    old = {c.contract_id for c in prev.contracts or ()}
    lines += [
        "New forward " + contract_words(c, me)[0].lower() + contract_words(c, me)[1:]
        for c in cur.contracts or ()
        if c.contract_id not in old
    ]
    now = {c.contract_id for c in cur.contracts or ()}
    lines += [
        f"Contract {c.contract_id} was settled in round {c.delivery_round}."
        for c in prev.contracts or ()
        if c.contract_id not in now
    ]
    return lines


def _coalition_news(prev: Observation, cur: Observation) -> list[str]:
    me, lines = cur.seat, []
    before = {c.coalition_id: c for c in prev.coalitions or ()}
    after = {c.coalition_id: c for c in cur.coalitions or ()}
    for cid, c in after.items():
        old = before.get(cid)
        if old is None:
            if me in c.invited:
                lines.append(f"{c.leader} invites you: {coalition_words(c, me)}")
            continue
        lines += [
            f"{m} joined coalition {cid}." for m in c.members if m not in old.members and m != me
        ]
        lines += [
            f"{m} left coalition {cid}." for m in old.members if m not in c.members and m != me
        ]
        if c.status != old.status:
            lines.append(f"Coalition {cid} is now {c.status}.")
    for cid in before.keys() - after.keys():
        lines.append(
            f"Coalition {cid} is over for you; your balance in its pool is back in your budget."
        )
    declared = {c.coalition_id for c in prev.public_coalitions}
    lines += [
        f"{c.leader} proposed coalition {c.coalition_id} with "
        + ", ".join(c.invited + c.members[1:])
        + "."
        for c in cur.public_coalitions
        if c.coalition_id not in declared and c.coalition_id not in after
    ]
    return lines


def _own_news(prev: Observation, cur: Observation) -> list[str]:
    lines = []
    if (
        prev.budget is not None
        and cur.budget is not None
        and abs(cur.budget - prev.budget) >= 0.005
    ):
        lines.append(f"Your budget went from {money(prev.budget)} to {money(cur.budget)} credits.")
    if (
        prev.reputation is not None
        and cur.reputation is not None
        and abs(cur.reputation - prev.reputation) >= 5e-4
    ):
        lines.append(f"Your reputation went from {prev.reputation:.3f} to {cur.reputation:.3f}.")
    old, new = prev.holdings or [], cur.holdings or []
    for k, n in enumerate(new):
        t = cur.round + k
        j = t - prev.round
        was = old[j] if 0 <= j < len(old) else 0
        if n != was:
            lines.append(f"You now own {count(n, 'block')} for round {t} (you had {was}).")
    before = {job.job_id: job for job in prev.jobs or ()}
    for job in cur.jobs or ():
        was_job = before.get(job.job_id)
        if was_job is None:
            lines.append("A new job arrived. " + job_words(job))
        elif job.status != was_job.status and job.status in ("done", "expired"):
            lines.append(job_words(job))
        elif job.progress > was_job.progress:
            ran = count(job.progress - was_job.progress, "block")
            lines.append(f"Job {job.job_id} ran {ran} ({job.progress} of {job.size} done).")
    return lines


# --- the screen --------------------------------------------------------------------------------
def sections(obs: Observation) -> list[tuple[str, list[str]]]:
    """The seat's screen as (heading, sentences): the market, then (bidders) the seat itself,
    its jobs, offers, contracts and coalitions; (the designer) market health. Empty sections
    are left out."""
    me = obs.seat
    role = "the market designer" if obs.role == "designer" else "a lab"
    head = f"Round {obs.round} (rounds 0 to {obs.rounds_total - 1}), {obs.phase} phase. You are {me}, {role}."
    out: list[tuple[str, list[str]]] = [(head, _market_lines(obs))]
    if obs.role == "bidder":
        out.append(("You", _you_lines(obs)))
        jobs = sorted(obs.jobs or (), key=lambda j: (j.status != "active", j.deadline))
        out.append(("Your jobs", [job_words(j) for j in jobs] or ["You have no job yet."]))
        received = [
            f"{o.offer_id}: {offer_words(o, me)}; open until the end of round {o.expires_round}."
            + (f" Their note: {quoted(o.message)}" if o.message else "")
            for o in obs.offers_received or ()
        ]
        sent = [f"{o.offer_id}: {offer_words(o, me)}." for o in obs.offers_sent or ()]
        out += [("Offers to you", received), ("Your open offers", sent)]
        out.append(("Your forward contracts", [contract_words(c, me) for c in obs.contracts or ()]))
        out.append(
            (
                "Your coalitions and invitations",
                [coalition_words(c, me) for c in obs.coalitions or ()],
            )
        )
    elif obs.designer_stats is not None and obs.designer_stats.welfare_ratio:
        out.append(("Market health", [health_words(obs)]))
    return [(h, body) for h, body in out if body]


def describe(obs: Observation) -> list[str]:
    """The seat's screen as plain lines: each heading of :func:`sections`, then its sentences
    indented by two spaces."""
    lines: list[str] = []
    for heading, body in sections(obs):
        lines.append(heading)
        lines += [f"  {line}" for line in body]
    return lines


def _market_lines(obs: Observation) -> list[str]:
    m, me = obs.mechanism, obs.seat
    shown = [
        words(f)
        for f in ("clearing_price", "winner_identity", "competing_bids", "bid_distribution")
        if getattr(m, f"reveal_{f}")
    ]
    lines = [
        f"This round: {count(obs.capacity, 'block')} for sale, block reliability "
        f"{obs.reliability:.2f}, operator floor price {money(obs.energy_floor)} credits.",
        f"Rules: {words(m.auction_type)} auction, reserve price {money(m.reserve_price)}, "
        f"{m.judge_pool_share:.0%} of capacity to the judge pool, coalition policy "
        f"{words(m.coalition_policy)}; penalties in credits: shill {money(m.shill_penalty)}, "
        f"withdrawal {money(m.withdrawal_penalty)}, collusion {money(m.collusion_penalty)}.",
        "After each auction bidders see: " + (", ".join(shown) or "only what they won") + ".",
        "Labs in the market: "
        + ", ".join(
            f"{s} ({'you, ' if s == me else ''}reputation {obs.reputations.get(s, 0.0):.2f})"
            for s in obs.active_labs
        )
        + ".",
    ]
    if obs.price_history:
        prices = ", ".join(f"round {r}: {money(p)}" for r, p in enumerate(obs.price_history))
        lines.append(f"Past prices per block: {prices}.")
    if obs.last_result is not None:
        lines.append(result_words(obs.last_result, obs.role == "designer"))
    lines += [shock_words(s, me) for s in obs.shocks]
    mine = {c.coalition_id for c in obs.coalitions or ()}
    lines += [
        f"Declared: coalition {c.coalition_id} ({c.status}) of " + ", ".join(c.members) + "."
        for c in obs.public_coalitions
        if c.coalition_id not in mine
    ]
    for p in obs.pitches:
        lines.append(
            f"{'You' if p.lab == me else p.lab} asked the judge for {count(p.blocks_requested, 'block')}: {quoted(p.text)}"
        )
        lines += [
            f"  disputed by {c.partition(': ')[0]}: {quoted(c.partition(': ')[2])}"
            for c in p.counters
        ]
    return lines


def _you_lines(obs: Observation) -> list[str]:
    lines = [f"Budget {money(obs.budget)} credits, reputation {obs.reputation or 0.0:.3f}."]
    reserved = obs.reserved or []
    owned = []
    for k, n in enumerate(obs.holdings or []):
        if n:
            kept = reserved[k] if k < len(reserved) else 0
            owned.append(
                f"round {obs.round + k}: {count(n, 'block')}"
                + (f" ({kept} reserved)" if kept else "")
            )
    lines.append("Blocks you own: " + ("; ".join(owned) if owned else "none") + ".")
    d = obs.delivery
    if d is not None and d.failure_rate > 0:
        lines.append(f"Each block you own fails this round with probability {d.failure_rate:.3f}.")
    if d is not None and d.short_sales:
        lines.append(
            f"You may sell blocks of later rounds short (before you own them): collateral "
            f"{d.collateral_fraction:g} x price + {money(d.collateral_per_block)} a block."
        )
    if d is not None and d.collateral_held:
        lines.append(f"Your collateral held on short sales: {money(d.collateral_held)} credits.")
    return lines


def health_words(obs: Observation) -> str:
    s = obs.designer_stats
    assert s is not None
    last = {
        n: getattr(s, n)[-1]
        for n in ("welfare_ratio", "fairness", "participation", "stability", "revenue")
        if getattr(s, n)
    }
    parts = ", ".join(f"{words(n)} {v:.2f}" for n, v in last.items())
    return f"Market health after the last auction: {parts}; suspected cartels: {s.suspected_cartels}; {count(s.active_labs, 'active lab')}."


def shock_words(s: ShockView, me: str) -> str:
    where = "" if s.target is None else f" hitting {who(s.target, me)}"
    return (
        f"Shock: {words(s.kind)} from round {s.round} for {count(s.duration, 'round')}, "
        f"magnitude {s.magnitude:g}{where}."
    )
