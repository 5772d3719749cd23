"""Bilateral negotiation: offers, counters, acceptances, forward contracts, messages and pitches.

Every ``handle_*`` function validates first and mutates only when everything checks out, raising
:class:`~market.core.ledger.ActionError` with a fix otherwise, so an invalid action changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from market.core.actions import (
    AcceptOffer,
    CounterOffer,
    CounterPitch,
    MakePitch,
    OfferSide,
    RejectOffer,
    SendMessage,
    SendOffer,
)
from market.core.delivery import check_short_sale, collateral, short_part
from market.core.ledger import ActionError, move_blocks, post_collateral, transfer_credits
from market.core.reservations import Reservations
from market.core.scenario_schema import DeliverySpec
from market.core.seats import bidder_seat, is_bidder_seat, lab_index
from market.core.summation import ordered_sum
from market.core.world import World

OfferStatus = Literal["open", "accepted", "rejected", "countered", "expired", "void", "withdrawn"]
MAX_OPEN_OFFERS = 16
MAX_MESSAGES_KEPT = 200


@dataclass(slots=True)
class Offer:
    offer_id: str
    sender: int
    recipient: int
    side: OfferSide  # what the sender does
    blocks: int
    price: float
    delivery_round: int
    created_round: int
    expires_round: int
    status: OfferStatus = "open"
    message: str | None = None
    countered_from: str | None = None
    short: bool = False  # a short forward sale (market.core.delivery)
    # a swap (the GPU-arena's): the sender, buying ``blocks``, also hands over these blocks
    give_blocks: int = 0
    give_round: int = -1

    @property
    def seller(self) -> int:
        return self.sender if self.side == "sell" else self.recipient

    @property
    def buyer(self) -> int:
        return self.recipient if self.side == "sell" else self.sender


@dataclass(slots=True)
class Contract:
    """An accepted forward sale: paid at acceptance, blocks delivered at ``delivery_round``."""

    contract_id: str
    seller: int
    buyer: int
    blocks: int
    price: float
    delivery_round: int
    delivered: int = -1  # -1 until settled
    # delivery risk (market.core.delivery): blocks sold short, their collateral, compensation
    short: int = 0
    collateral: float = 0.0
    compensation_rate: float = 0.0


@dataclass(slots=True)
class Message:
    sender: int
    recipients: tuple[int, ...] | None  # None: public
    text: str
    round: int


@dataclass(slots=True)
class Pitch:
    lab: int
    text: str
    blocks_requested: int
    job_id: str | None
    round: int
    counters: list[tuple[int, str]] = field(default_factory=list)


@dataclass(slots=True)
class Book:
    """The negotiation state of an episode."""

    offers: dict[str, Offer] = field(default_factory=dict)
    contracts: list[Contract] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    pitches: dict[int, Pitch] = field(default_factory=dict)  # this round's, by lab
    next_offer: int = 0
    next_contract: int = 0
    reserved: Reservations = field(default_factory=Reservations)  # blocks set aside, not for sale
    delivery: DeliverySpec = field(default_factory=DeliverySpec)  # short-sale rules

    def open_offers_of(self, lab: int) -> int:
        return ordered_sum(
            1 for o in self.offers.values() if o.status == "open" and o.sender == lab
        )

    def prune(self) -> None:
        """Forget closed offers and settled contracts (end of round): observations stay O(open)."""
        self.offers = {k: o for k, o in self.offers.items() if o.status == "open"}
        self.contracts = [c for c in self.contracts if c.delivered < 0]

    def committed(self, seller: int, round_: int) -> int:
        """Blocks ``seller`` has promised on open forward contracts for ``round_``."""
        return ordered_sum(
            c.blocks
            for c in self.contracts
            if c.seller == seller and c.delivery_round == round_ and c.delivered < 0
        )


def seat_index(seat: str, n_labs: int, field_name: str) -> int:
    if not is_bidder_seat(seat):
        raise ActionError(f"{field_name} must be a bidder seat such as 'bidder_1', got {seat!r}")
    index = lab_index(seat)
    if index >= n_labs:
        raise ActionError(
            f"{field_name} {seat!r} does not exist; seats are {bidder_seat(0)} .. {bidder_seat(n_labs - 1)}"
        )
    return index


def _active_counterparty(world: World, seat: str, me: int, field_name: str) -> int:
    other = seat_index(seat, len(world.labs), field_name)
    if other == me:
        raise ActionError(f"{field_name} is yourself; address another lab")
    if not world.labs[other].active:
        raise ActionError(
            f"{seat} is not in the market now; pick an active lab from the observation"
        )
    return other


def _check_can_deliver(
    world: World, book: Book, seller: int, blocks: int, delivery: int, now: int, who: str
) -> None:
    owned = int(world.holdings[seller, delivery])
    free = owned - book.committed(seller, delivery)  # contracts due now deliver at the round's end
    reserved = book.reserved.blocks(seller, delivery)  # reserved blocks are not for sale
    if free - reserved < blocks:
        kept = f" (and {reserved} reserved: release_capacity frees them)" if reserved else ""
        free = max(free - reserved, 0) if reserved else free
        raise ActionError(
            f"{who} own{'s' if who != 'you' else ''} {free} uncommitted block(s) for round {delivery}"
            f"{kept}, not {blocks}; offer at most {max(free, 0)} or buy blocks first"
        )


def _check_short(
    world: World,
    book: Book,
    seller: int,
    blocks: int,
    price: float,
    delivery: int,
    now: int,
    who: str,
) -> None:
    # reserved blocks are not for sale: a short sale counts them as spoken for
    committed = book.committed(seller, delivery) + book.reserved.blocks(seller, delivery)
    check_short_sale(world, book.delivery, seller, blocks, price, delivery, now, committed, who)


def _post_short_collateral(world: World, book: Book, contract: Contract) -> None:
    """A short sale just paid for: its uncovered blocks' collateral leaves the seller's budget."""
    seller, when = contract.seller, contract.delivery_round
    # the new contract is not in the book yet; reserved blocks are spoken for
    committed = book.committed(seller, when) + book.reserved.blocks(seller, when)
    contract.short = short_part(int(world.holdings[seller, when]), committed, contract.blocks)
    contract.collateral = collateral(book.delivery, contract.price, contract.blocks, contract.short)
    contract.compensation_rate = book.delivery.breach_compensation if contract.short else 0.0
    if contract.collateral > 0:
        post_collateral(world, seller, contract.collateral)


def _check_can_pay(world: World, buyer: int, price: float, who: str) -> None:
    if world.labs[buyer].budget + 1e-9 < price:
        raise ActionError(
            f"{who} {'have' if who == 'you' else 'has'} {world.labs[buyer].budget:.2f} credits, "
            f"not {price:.2f}; lower the price"
        )


def handle_send_offer(
    world: World, book: Book, me: int, action: SendOffer, now: int, rounds: int
) -> Offer:
    other = _active_counterparty(world, action.to, me, "to")
    delivery = now if action.delivery_round is None else action.delivery_round
    if not now <= delivery < rounds:
        raise ActionError(
            f"delivery_round must be between the current round {now} and the last round {rounds - 1}"
        )
    if book.open_offers_of(me) >= MAX_OPEN_OFFERS:
        raise ActionError(
            f"you already have {MAX_OPEN_OFFERS} open offers; wait for replies or withdraw one with reject_offer"
        )
    give_round = _give_round(action.give_blocks, action.give_round, now, rounds)
    if action.give_blocks:
        _check_can_deliver(world, book, me, action.give_blocks, give_round, now, "you")
    short = action.side == "sell" and action.short
    if short:
        _check_short(world, book, me, action.blocks, action.price, delivery, now, "you")
    elif action.side == "sell":
        _check_can_deliver(world, book, me, action.blocks, delivery, now, "you")
    else:
        _check_can_pay(world, me, action.price, "you")
    offer = Offer(
        offer_id=f"o{book.next_offer}",
        sender=me,
        recipient=other,
        side=action.side,
        blocks=action.blocks,
        price=action.price,
        delivery_round=delivery,
        created_round=now,
        # never open past delivery (of either leg of a swap)
        expires_round=min(
            delivery, now + action.expires_in - 1, *([give_round] * (give_round >= 0))
        ),
        message=action.message,
        short=short,
        give_blocks=action.give_blocks,
        give_round=give_round,
    )
    book.next_offer += 1
    book.offers[offer.offer_id] = offer
    return offer


def _give_round(give_blocks: int, give_round: int | None, now: int, rounds: int) -> int:
    """The round of a swap's give leg (-1 without one), checked like a delivery round."""
    if not give_blocks:
        return -1
    r = now if give_round is None else give_round
    if not now <= r < rounds:
        raise ActionError(
            f"give_round must be between the current round {now} and the last round {rounds - 1}"
        )
    return r


def _move_or_contract(
    world: World, book: Book, seller: int, buyer: int, blocks: int, price: float, r: int, now: int
) -> Contract | None:
    """Blocks of round ``r`` change hands: now if ``r`` is this round, else a forward contract."""
    if r == now:
        move_blocks(world, seller, buyer, now, blocks)
        return None
    contract = Contract(f"k{book.next_contract}", seller, buyer, blocks, price, r)
    book.next_contract += 1
    book.contracts.append(contract)
    return contract


def _open_offer_to_me(book: Book, offer_id: str, me: int, verb: str) -> Offer:
    offer = book.offers.get(offer_id)
    if offer is None:
        raise ActionError(
            f"offer {offer_id!r} does not exist; use an offer_id from offers_received"
        )
    if offer.recipient != me:
        raise ActionError(
            f"offer {offer_id} is not addressed to you; you can only {verb} offers in offers_received"
        )
    if offer.status != "open":
        raise ActionError(
            f"offer {offer_id} is already {offer.status}; it can no longer be {verb}ed"
        )
    return offer


def handle_counter(
    world: World, book: Book, me: int, action: CounterOffer, now: int, rounds: int
) -> Offer:
    original = _open_offer_to_me(book, action.offer_id, me, "counter")
    side: OfferSide = "buy" if original.side == "sell" else "sell"
    if book.open_offers_of(me) >= MAX_OPEN_OFFERS:
        raise ActionError(
            f"you already have {MAX_OPEN_OFFERS} open offers; wait for replies or withdraw one with reject_offer"
        )
    if action.give_blocks and side != "buy":
        raise ActionError(
            f"offer {original.offer_id} is a buy offer, so your counter sells; a swap's "
            "give_blocks go with a counter that buys: drop them (blocks = what you sell)"
        )
    give_round = _give_round(action.give_blocks, action.give_round, now, rounds)
    if action.give_blocks:
        _check_can_deliver(world, book, me, action.give_blocks, give_round, now, "you")
    if side == "sell":
        _check_can_deliver(world, book, me, action.blocks, original.delivery_round, now, "you")
    else:
        _check_can_pay(world, me, action.price, "you")
    counter = Offer(
        offer_id=f"o{book.next_offer}",
        sender=me,
        recipient=original.sender,
        side=side,
        blocks=action.blocks,
        price=action.price,
        delivery_round=original.delivery_round,
        created_round=now,
        expires_round=max(original.expires_round, now) if give_round < 0 else now,
        message=action.message,
        countered_from=original.offer_id,
        give_blocks=action.give_blocks,
        give_round=give_round,
    )
    book.next_offer += 1
    original.status = "countered"
    book.offers[counter.offer_id] = counter
    return counter


def handle_reject(book: Book, me: int, action: RejectOffer) -> Offer:
    offer = book.offers.get(action.offer_id)
    if offer is None:
        raise ActionError(
            f"offer {action.offer_id!r} does not exist; use an offer_id from your observation"
        )
    if offer.status != "open":
        raise ActionError(f"offer {offer.offer_id} is already {offer.status}")
    if offer.recipient == me:
        offer.status = "rejected"
    elif offer.sender == me:
        offer.status = "withdrawn"
    else:
        raise ActionError(f"offer {offer.offer_id} is neither to you nor from you")
    return offer


def handle_accept(
    world: World, book: Book, me: int, action: AcceptOffer, now: int
) -> tuple[Offer, Contract | None]:
    """Accept: credits move now; current-round blocks move now, later ones become a contract.

    If the acceptor cannot honour its side, the action is invalid. If the sender no longer can,
    the offer is void (the acceptor did nothing wrong).
    """
    offer = _open_offer_to_me(book, action.offer_id, me, "accept")
    if offer.expires_round < now:
        raise ActionError(
            f"offer {offer.offer_id} expired at the end of round {offer.expires_round}"
        )
    seller, buyer = offer.seller, offer.buyer
    if not world.labs[offer.sender].active:
        offer.status = "void"
        return offer, None
    acceptor_role = "seller" if seller == me else "buyer"
    try:
        if acceptor_role == "seller":
            _check_can_deliver(world, book, seller, offer.blocks, offer.delivery_round, now, "you")
        else:
            _check_can_pay(world, buyer, offer.price, "you")
    except ActionError:
        raise
    try:
        if acceptor_role == "seller":
            _check_can_pay(world, buyer, offer.price, "the sender")
        elif offer.short:
            _check_short(
                world,
                book,
                seller,
                offer.blocks,
                offer.price,
                offer.delivery_round,
                now,
                "the sender",
            )
        else:
            _check_can_deliver(
                world, book, seller, offer.blocks, offer.delivery_round, now, "the sender"
            )
        if offer.give_blocks:  # a swap: the sender (the buyer) also hands blocks over
            _check_can_deliver(
                world, book, buyer, offer.give_blocks, offer.give_round, now, "the sender"
            )
    except ActionError:
        offer.status = "void"
        return offer, None
    transfer_credits(world, buyer, seller, offer.price)
    offer.status = "accepted"
    contract = None
    if offer.delivery_round == now:
        move_blocks(world, seller, buyer, now, offer.blocks)
    else:
        contract = Contract(
            f"k{book.next_contract}", seller, buyer, offer.blocks, offer.price, offer.delivery_round
        )
        if offer.short:
            _post_short_collateral(world, book, contract)
        book.next_contract += 1
        book.contracts.append(contract)
    if offer.give_blocks:  # the give leg carries no price: the swap's price is the main leg's
        leg = _move_or_contract(
            world, book, buyer, seller, offer.give_blocks, 0.0, offer.give_round, now
        )
        contract = contract or leg
    return offer, contract


def handle_message(world: World, book: Book, me: int, action: SendMessage, now: int) -> Message:
    if not action.text.strip():
        raise ActionError("text is empty; write the message in 'text'")
    targets = action.to
    if targets == "all" or targets == ["all"]:
        recipients: tuple[int, ...] | None = None
    else:
        seats = [targets] if isinstance(targets, str) else targets
        if not seats:
            raise ActionError("'to' is empty; use 'all' or a list of seats")
        recipients = tuple(sorted({_active_counterparty(world, s, me, "to") for s in seats}))
    message = Message(me, recipients, action.text, now)
    book.messages.append(message)
    if len(book.messages) > MAX_MESSAGES_KEPT:
        del book.messages[: len(book.messages) - MAX_MESSAGES_KEPT]
    return message


def handle_pitch(world: World, book: Book, me: int, action: MakePitch, now: int) -> Pitch:
    if not action.text.strip():
        raise ActionError("text is empty; explain to the judge why you need blocks")
    if action.job_id is not None and not any(
        j.job_id == action.job_id for j in world.labs[me].live_jobs()
    ):
        raise ActionError(
            f"job_id {action.job_id!r} is not one of your active jobs; omit it or use one from your jobs"
        )
    pitch = Pitch(me, action.text, action.blocks_requested, action.job_id, now)
    book.pitches[me] = pitch  # a later pitch replaces the earlier one: repeating earns nothing
    return pitch


def handle_counter_pitch(world: World, book: Book, me: int, action: CounterPitch) -> Pitch:
    target = _active_counterparty(world, action.target, me, "target")
    pitch = book.pitches.get(target)
    if pitch is None:
        raise ActionError(
            f"{action.target} has not pitched this round; there is nothing to counter"
        )
    if not action.text.strip():
        raise ActionError("text is empty; say what is wrong with the pitch")
    pitch.counters.append((me, action.text))
    return pitch


def expire_offers(book: Book, now: int) -> None:
    """At the end of round ``now``, offers whose last round was ``now`` expire."""
    for offer in book.offers.values():
        if offer.status == "open" and offer.expires_round <= now:
            offer.status = "expired"


def void_offers_of(book: Book, lab: int) -> None:
    for offer in book.offers.values():
        if offer.status == "open" and lab in (offer.sender, offer.recipient):
            offer.status = "void"
