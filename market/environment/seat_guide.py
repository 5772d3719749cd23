"""What a person at a seat is told: the actions valid now, the story between turns, the screen.

Shared by the terminal seat (``agents/human.py``) and the browser seat, so both say the same
thing. Every function here is pure and reads only the seat's
:class:`~market.environment.observations.Observation` (a browser seat rebuilds it from JSON with
``Observation.model_validate``), never the env, so it tells a seat nothing it may not see.

Rules:

* :func:`valid_actions` offers an action type only when the env would accept some action of
  that type now, and every type the RL action mask has a masked-in entry for
  (:mod:`market.environment.wrappers`; a property test checks both). Its fields list the values
  valid now (other active labs, the seat's offers, coalitions, jobs, rounds). Optional fields a
  person rarely needs (``message``, ``conditions``, ``reasoning``, pitch claims) are named in
  ``ActionChoice.extra``, not asked by default.
* :func:`story` says in plain sentences what changed between two of the seat's turns, as far
  as the seat can see it, starting with the env's :func:`verdict` on its last action.
* :func:`describe` is the seat's state as plain sentences, grouped by :func:`sections`.

Sentences carry no markup and no Python reprs. Text other seats wrote (messages, pitches, offer
notes, coalition purposes) is passed on in double quotes, as written: a display must show it as
plain text, never interpret it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from market.core.coalitions import MAX_OPEN_COALITIONS
from market.core.mechanisms import AUCTION_TYPES, COALITION_POLICIES
from market.core.negotiation import MAX_OPEN_OFFERS
from market.core.summation import ordered_sum
from market.environment.observations import JobView, Observation, OfferView, marginal_values
from market.environment.seat_story import (
    coalition_words,
    count,
    describe,
    money,
    offer_words,
    sections,
    story,
    verdict,
    words,
)

__all__ = [
    "ActionChoice",
    "Choice",
    "FieldChoice",
    "describe",
    "sections",
    "story",
    "valid_actions",
    "verdict",
]

#: how a field's answer is read: free "text", an "int", a "number", "numbers" (a list, highest
#: first for bids), one of the field's choices ("choice"), several ("choices"), or "bool"
FIELD_KINDS = ("text", "int", "number", "numbers", "choice", "choices", "bool")


@dataclass(frozen=True, slots=True)
class Choice:
    """One value a field may take now (``value``, as the action wants it) and what it is."""

    value: str
    label: str


@dataclass(frozen=True, slots=True)
class FieldChoice:
    """One field of an action to ask for.

    ``name`` is the action's field (``mechanism.reserve_price`` for a field of the designer's
    mechanism); ``prompt`` the plain question; ``choices`` the values valid now (empty: free
    entry of ``kind``, one of :data:`FIELD_KINDS`); ``default`` what a blank answer means, as it
    would be typed (None: a blank leaves an optional field out and is refused for a required one).
    """

    name: str
    prompt: str
    required: bool
    choices: tuple[Choice, ...] = ()
    kind: str = "text"
    default: str | None = None


@dataclass(frozen=True, slots=True)
class ActionChoice:
    """An action type the seat may take now: a one-line meaning and the fields it needs."""

    action_type: str
    meaning: str
    fields: tuple[FieldChoice, ...] = ()
    extra: tuple[str, ...] = ()  # optional fields of the action that are not asked by default


# --- the valid actions -------------------------------------------------------------------------
def others(obs: Observation) -> list[str]:
    return [s for s in obs.active_labs if s != obs.seat]


def _committed(obs: Observation, round_: int) -> int:
    """Blocks the seat promised on open contracts for ``round_`` (not for sale)."""
    return ordered_sum(
        c.blocks for c in obs.contracts or () if c.seller == obs.seat and c.delivery_round == round_
    )


def free_blocks(obs: Observation, k: int) -> int:
    """Blocks the seat owns for round ``obs.round + k`` that are neither promised nor reserved."""
    holdings, reserved = obs.holdings or [], obs.reserved or []
    if not 0 <= k < len(holdings):
        return 0
    held = holdings[k] - (reserved[k] if k < len(reserved) else 0)
    return held - _committed(obs, obs.round + k)


def can_accept(obs: Observation, o: OfferView) -> bool:
    """Whether the env lets the seat accept offer ``o`` (pay for a sale, deliver for a purchase)."""
    if o.side == "sell":
        return (obs.budget or 0.0) + 1e-9 >= o.price
    return free_blocks(obs, o.delivery_round - obs.round) >= o.blocks


def _offer_choice(o: OfferView, me: str) -> Choice:
    return Choice(o.offer_id, f"{o.offer_id}: {offer_words(o, me)}")


def _seat_choices(seats: list[str]) -> tuple[Choice, ...]:
    return tuple(Choice(s, s) for s in seats)


def _rounds(obs: Observation, keep: Callable[[int], bool]) -> tuple[Choice, ...]:
    return tuple(
        Choice(str(obs.round + k), f"round {obs.round + k}")
        for k in range(len(obs.holdings or []))
        if keep(k)
    )


def _live(obs: Observation) -> list[JobView]:
    return [j for j in obs.jobs or () if j.status == "active"]


def _job_choices(obs: Observation) -> tuple[Choice, ...]:
    return tuple(
        Choice(
            j.job_id,
            f"{j.job_id}: {count(j.size - j.progress, 'block')} left by round {j.deadline}",
        )
        for j in _live(obs)
    )


def _int(name: str, prompt: str, default: str | None = None) -> FieldChoice:
    return FieldChoice(name, prompt, default is None, kind="int", default=default)


def _number(name: str, prompt: str, default: str | None = None) -> FieldChoice:
    return FieldChoice(name, prompt, default is None, kind="number", default=default)


def _text(name: str, prompt: str) -> FieldChoice:
    return FieldChoice(name, prompt, True)


def _pick(
    name: str, prompt: str, choices: tuple[Choice, ...], default: str | None = None
) -> FieldChoice:
    return FieldChoice(name, prompt, default is None, choices, "choice", default)


def _send_offer(obs: Observation) -> ActionChoice | None:
    labs = others(obs)
    if not labs or len(obs.offers_sent or ()) >= MAX_OPEN_OFFERS:
        return None
    can_sell = any(free_blocks(obs, k) > 0 for k in range(len(obs.holdings or [])))
    sides: tuple[Choice, ...] = (Choice("sell", "sell blocks you own"),) if can_sell else ()
    sides += (Choice("buy", "buy blocks"),)
    return ActionChoice(
        "send_offer",
        "Offer another lab a trade of blocks for credits (they accept, reject or counter).",
        (
            _pick("to", "Which lab?", _seat_choices(labs)),
            _pick("side", "Do you sell or buy?", sides, sides[0].value),
            _int("blocks", "How many blocks?"),
            _number("price", "Total price in credits for all the blocks?"),
            _pick(
                "delivery_round",
                "Blocks of which round?",
                _rounds(obs, lambda k: True),
                str(obs.round),
            ),
        ),
        ("expires_in", "message", "short", "conditions", "reasoning"),
    )


def _counter_offer(obs: Observation) -> ActionChoice | None:
    if len(obs.offers_sent or ()) >= MAX_OPEN_OFFERS:
        return None
    # countering a sale means buying (any price you can pay, 0 too); countering a purchase means
    # selling blocks of its round, which needs at least one free block then
    ok = [
        o
        for o in obs.offers_received or ()
        if o.side == "sell" or free_blocks(obs, o.delivery_round - obs.round) >= 1
    ]
    if not ok:
        return None
    return ActionChoice(
        "counter_offer",
        "Turn down an offer to you and propose other terms for the same trade.",
        (
            _pick("offer_id", "Which offer?", tuple(_offer_choice(o, obs.seat) for o in ok)),
            _int("blocks", "How many blocks instead?"),
            _number("price", "Total price in credits instead?"),
        ),
        ("message", "conditions", "reasoning"),
    )


def _accept_offer(obs: Observation) -> ActionChoice | None:
    ok = [o for o in obs.offers_received or () if can_accept(obs, o)]
    if not ok:
        return None
    return ActionChoice(
        "accept_offer",
        "Take an offer made to you: the credits (and this round's blocks) move at once.",
        (_pick("offer_id", "Which offer?", tuple(_offer_choice(o, obs.seat) for o in ok)),),
        ("reasoning",),
    )


def _reject_offer(obs: Observation) -> ActionChoice | None:
    mine = [*(obs.offers_received or ()), *(obs.offers_sent or ())]
    if not mine:
        return None
    return ActionChoice(
        "reject_offer",
        "Turn down an offer to you, or withdraw one you sent.",
        (_pick("offer_id", "Which offer?", tuple(_offer_choice(o, obs.seat) for o in mine)),),
        ("reasoning",),
    )


def _form_coalition(obs: Observation) -> ActionChoice | None:
    led = ordered_sum(1 for c in obs.coalitions or () if c.leader == obs.seat)
    labs = others(obs)
    if not labs or led >= MAX_OPEN_COALITIONS:
        return None
    return ActionChoice(
        "form_coalition",
        "Propose a buying group: you pay into a shared pool and bid for the group as its leader.",
        (
            FieldChoice(
                "members", "Which labs do you invite?", True, _seat_choices(labs), "choices"
            ),
            _number("contribution", "Credits you put into the pool now?", "0"),
            _pick(
                "split",
                "How are won blocks shared?",
                (Choice("proportional", "by contribution"), Choice("equal", "equally")),
                "proportional",
            ),
            _int("term_rounds", "For how many rounds?", "1"),
        ),
        ("purpose", "pledge_blocks", "reasoning"),
    )


def _commit(obs: Observation) -> ActionChoice | None:
    invites = [c for c in obs.coalitions or () if obs.seat in c.invited]
    if not invites:
        return None
    return ActionChoice(
        "commit_to_coalition",
        "Join a coalition you are invited to, paying into its pool.",
        (
            _pick(
                "coalition_id",
                "Which coalition?",
                tuple(Choice(c.coalition_id, coalition_words(c, obs.seat)) for c in invites),
            ),
            _number("contribution", "Credits you put into the pool?", "0"),
        ),
        ("pledge_blocks", "reasoning"),
    )


def _leave(obs: Observation) -> ActionChoice | None:
    mine = list(obs.coalitions or ())
    if not mine:
        return None
    fee = obs.mechanism.withdrawal_penalty
    return ActionChoice(
        "leave_coalition",
        f"Leave a coalition or decline an invitation (leaving an active one early costs {money(fee)} credits).",
        (
            _pick(
                "coalition_id",
                "Which coalition?",
                tuple(Choice(c.coalition_id, coalition_words(c, obs.seat)) for c in mine),
            ),
        ),
        ("reasoning",),
    )


def _send_message(obs: Observation) -> ActionChoice | None:
    to = (Choice("all", "everyone (public)"), *_seat_choices(others(obs)))
    return ActionChoice(
        "send_message",
        "Say something to every lab, or privately to some.",
        (
            FieldChoice("to", "To whom?", False, to, "choices", "all"),
            _text("text", "Your message?"),
        ),
        ("reasoning",),
    )


def _make_pitch(obs: Observation) -> ActionChoice | None:
    jobs = _job_choices(obs)
    if not jobs:
        return None
    pool = int(obs.capacity * obs.mechanism.judge_pool_share)
    return ActionChoice(
        "make_pitch",
        f"Ask the judge for free blocks from this round's judge pool ({count(pool, 'block')}); "
        "asking for more than your jobs need costs reputation.",
        (
            _text("text", "Why do you need blocks?"),
            _int("blocks_requested", "How many blocks?", "1"),
            FieldChoice("job_id", "For which job?", False, jobs, "choice"),
        ),
        ("claimed_deadline", "claimed_blocks", "claimed_value", "reasoning"),
    )


def _counter_pitch(obs: Observation) -> ActionChoice | None:
    targets = [p.lab for p in obs.pitches if p.lab != obs.seat and p.lab in obs.active_labs]
    if not targets:
        return None
    return ActionChoice(
        "counter_pitch",
        "Dispute another lab's pitch to the judge.",
        (
            _pick("target", "Whose pitch?", _seat_choices(targets)),
            _text("text", "What is wrong with it?"),
        ),
        ("reasoning",),
    )


def _allocate(obs: Observation) -> ActionChoice | None:
    jobs = _job_choices(obs)
    if not jobs:
        return None
    return ActionChoice(
        "allocate_to_job",
        "Choose which job your blocks of this round run first (otherwise: earliest deadline first).",
        (
            _pick("job_id", "Which job?", jobs),
            _int("blocks", "How many of this round's blocks (0 keeps the job off)?"),
        ),
        ("reasoning",),
    )


def _reserve(obs: Observation) -> ActionChoice | None:
    rounds = _rounds(obs, lambda k: free_blocks(obs, k) > 0)
    if not rounds:
        return None
    return ActionChoice(
        "reserve_capacity",
        "Keep blocks you own for your own jobs: reserved blocks cannot be sold until released.",
        (
            _int("blocks", "How many blocks?", "1"),
            _pick("round", "Blocks of which round?", rounds, rounds[0].value),
        ),
        ("job_id", "reasoning"),
    )


def _release(obs: Observation) -> ActionChoice | None:
    reserved = obs.reserved or []
    rounds = _rounds(obs, lambda k: k < len(reserved) and reserved[k] > 0)
    if not rounds:
        return None
    return ActionChoice(
        "release_capacity",
        "Release reserved blocks so they can be sold again.",
        (
            _int("blocks", "How many blocks?", "1"),
            _pick("round", "Blocks of which round?", rounds, rounds[0].value),
        ),
        ("reasoning",),
    )


def _bid(obs: Observation) -> ActionChoice | None:
    values = marginal_values(obs)[: max(1, obs.capacity)]
    hint = (
        " Your jobs value the next blocks at about "
        + ", ".join(f"{v:.2f}" for v in values[:6])
        + "."
        if values
        else " At a fair share of this round's blocks, none of your jobs can still gain from more."
    )
    fields = [
        FieldChoice(
            "bids",
            f"Your price for each block, highest first (e.g. 40, 30; at most {obs.capacity} "
            f"and {money(obs.budget)} credits in all; blank: no bid)?",
            False,
            kind="numbers",
            default="",
        )
    ]
    pools = [
        c
        for c in obs.coalitions or ()
        if c.leader == obs.seat
        and c.status == "active"
        and obs.mechanism.coalition_policy != "restrict"
    ]
    if pools:
        choices = tuple(Choice(c.coalition_id, coalition_words(c, obs.seat)) for c in pools)
        fields.append(
            FieldChoice(
                "coalition_id",
                "Bid for a coalition you lead (blank: for yourself)?",
                False,
                choices,
                "choice",
            )
        )
    return ActionChoice(
        "bid",
        "Bid for blocks of this round in the auction: one price per block, highest first." + hint,
        tuple(fields),
        ("reasoning",),
    )


def _set_mechanism(obs: Observation) -> ActionChoice | None:
    """Every mechanism field, optional: a blank answer leaves it out, keeping the rule in force
    (named in the prompt)."""
    m = obs.mechanism
    yes_no = (Choice("true", "yes"), Choice("false", "no"))

    def rule(name: str, prompt: str, kind: str, choices: tuple[Choice, ...] = ()) -> FieldChoice:
        now = getattr(m, name)
        shown = ("yes" if now else "no") if kind == "bool" else words(str(now))
        return FieldChoice(f"mechanism.{name}", f"{prompt} (now {shown})", False, choices, kind)

    flags = ("reserve", "competing_bids", "winner_identity", "clearing_price", "bid_distribution")
    fields = [
        rule(
            "auction_type",
            "Auction type?",
            "choice",
            tuple(Choice(t, words(t)) for t in AUCTION_TYPES),
        ),
        rule("reserve_price", "Reserve price per block, in credits?", "number"),
        *(rule(f"reveal_{f}", f"Show bidders the {words(f)}?", "bool", yes_no) for f in flags),
        *(
            rule(n, f"{words(n).capitalize()}, in credits?", "number")
            for n in ("shill_penalty", "withdrawal_penalty", "collusion_penalty")
        ),
        rule(
            "coalition_policy",
            "Coalition policy?",
            "choice",
            tuple(Choice(p, words(p)) for p in COALITION_POLICIES),
        ),
        rule("judge_pool_share", "Share of capacity for the judge pool, 0 to 1?", "number"),
    ]
    return ActionChoice(
        "set_mechanism",
        "Set the market's rules from this round on (a blank answer keeps a rule as it is).",
        tuple(fields),
        ("mechanism.units", "reasoning"),
    )


def _always(kind: str, meaning: str) -> Callable[[Observation], ActionChoice | None]:
    return lambda obs: ActionChoice(kind, meaning, (), ("reasoning",))


_BUILDERS: dict[str, Callable[[Observation], ActionChoice | None]] = {
    "set_mechanism": _set_mechanism,
    "send_offer": _send_offer,
    "counter_offer": _counter_offer,
    "accept_offer": _accept_offer,
    "reject_offer": _reject_offer,
    "form_coalition": _form_coalition,
    "commit_to_coalition": _commit,
    "leave_coalition": _leave,
    "send_message": _send_message,
    "make_pitch": _make_pitch,
    "counter_pitch": _counter_pitch,
    "allocate_to_job": _allocate,
    "reserve_capacity": _reserve,
    "release_capacity": _release,
    "bid": _bid,
    "wait": _always("wait", "Do nothing this turn."),
    "finish": _always(
        "finish", "Leave the market for the rest of the episode (your jobs settle now)."
    ),
}


def valid_actions(obs: Observation) -> list[ActionChoice]:
    """The action types the env would accept from this seat now, in ``legal_actions`` order."""
    out: list[ActionChoice] = []
    for kind in obs.legal_actions:
        choice = _BUILDERS[kind](obs) if kind in _BUILDERS else ActionChoice(kind, words(kind))
        if choice is not None:
            out.append(choice)
    return out
