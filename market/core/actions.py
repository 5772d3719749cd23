"""Actions: a pydantic discriminated union on ``action_type``, parsed from models, dicts or JSON.

Names follow the GPU-arena seed where the meaning matches (``send_offer`` ... ``finish``), plus
``bid``, ``leave_coalition`` and the designer's ``set_mechanism``. The designer seat also accepts
the DAEDALUS designer's flat mechanism JSON as is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from market.core.arena import arena_payload, block_rounds
from market.core.arena_payloads import BlockContext, BlockIdError
from market.core.mechanism_update import (  # re-exported: part of the action vocabulary
    DAEDALUS_PENALTY_MAX as DAEDALUS_PENALTY_MAX,
)
from market.core.mechanism_update import MONEY_FIELDS as MONEY_FIELDS
from market.core.mechanism_update import ActionParseError as ActionParseError
from market.core.mechanism_update import MechanismUnits as MechanismUnits
from market.core.mechanism_update import MechanismUpdate as MechanismUpdate
from market.core.seats import seat_alias, seats_alias
from market.core.trust import lone_surrogate

OfferSide = Literal["sell", "buy"]  # what the sender of an offer does
CoalitionSplit = Literal["proportional", "equal"]  # how a coalition shares its blocks

MAX_TEXT = 1000
MAX_BID_UNITS = 100_000


def _clip_text(value: str) -> str:
    """Keep printable text only and truncate: LLM output can be arbitrarily long or binary."""
    cleaned = "".join(ch for ch in value[: MAX_TEXT * 2] if ch.isprintable() or ch in "\n\t")
    return cleaned[:MAX_TEXT]


Text = Annotated[str, AfterValidator(_clip_text)]
Seat = Annotated[str, BeforeValidator(seat_alias)]  # also the arena's lab_<i> or a lab index
Conditions = dict[str, JsonValue] | None


def _alias(*names: str) -> AliasChoices:
    """Our field name first (the schema shows it), then the GPU-arena's (market/core/arena.py)."""
    return AliasChoices(*names)


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str | None = Field(
        None, description="Optional: the seat this action is for; must be the acting seat."
    )
    reasoning: Text | None = Field(
        None, description="Optional free text (kept in transcripts, ignored by the market)."
    )

    if TYPE_CHECKING:  # every concrete action declares it as a Literal field with its one value
        action_type: str

    @model_validator(mode="before")
    @classmethod
    def _arena(cls, data: object) -> object:
        """GPU-arena payloads: null arena fields dropped, block id lists turned into counts."""
        return arena_payload(data)


class SetMechanism(_Action):
    """Designer: choose the mechanism for this round (or the episode)."""

    action_type: Literal["set_mechanism"] = "set_mechanism"
    mechanism: MechanismUpdate = MechanismUpdate()


class SendOffer(_Action):
    """Offer to sell (or buy) ``blocks`` blocks for round ``delivery_round`` at ``price`` credits in total.

    Credits move when the offer is accepted. Blocks of the current round move then too (the seller
    must own them); blocks of a later round are a forward contract delivered at that round, and a
    seller short of blocks then is in breach (refund plus withdrawal penalty). With ``short`` a
    forward seller may sell blocks it does not own yet, backed by collateral (docs/world.md,
    Delivery risk).
    """

    action_type: Literal["send_offer"] = "send_offer"
    to: Seat = Field(validation_alias=_alias("to", "target_lab_id"))
    side: OfferSide = "sell"
    blocks: int = Field(ge=1, le=1_000_000)
    price: float = Field(ge=0.0, le=1e9, validation_alias=_alias("price", "payment"))
    delivery_round: int | None = Field(
        None, ge=0, description="Absolute round; default: the current round."
    )
    expires_in: int = Field(
        1, ge=1, le=1000, description="Rounds the offer stays open (1: until this round's bidding)."
    )
    message: Text | None = None
    conditions: Conditions = Field(
        None, description="Optional free-form terms: recorded, not enforced by the market."
    )
    # --- delivery risk (market.core.delivery) ---
    short: bool = Field(
        False,
        description="Sell forward blocks you do not own yet (sell offers for a later round only): "
        "collateral is taken from your budget at acceptance; at delivery you must hold the "
        "blocks or you breach.",
    )
    # --- swaps (the GPU-arena's block_ids + requested_block_ids; market.core.arena_payloads) ---
    give_blocks: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="A swap (buy offers only): blocks of give_round you hand over as well as "
        "paying price; accepting moves both legs at once.",
    )
    give_round: int | None = Field(
        None, ge=0, description="Absolute round of the give_blocks; default: the current round."
    )

    @model_validator(mode="after")
    def _swap_buys(self) -> SendOffer:
        if self.give_blocks and self.side != "buy":
            raise ValueError(
                "give_blocks makes a swap, which is a buy offer (you get blocks and give blocks); "
                "use side 'buy'"
            )
        return self


class CounterOffer(_Action):
    """Reject an offer addressed to you and send its sender new terms for the same trade.

    The trade direction stays the same (if they offered to sell, you now offer to buy) and so does
    the delivery round; only ``blocks`` and ``price`` change.
    """

    action_type: Literal["counter_offer"] = "counter_offer"
    offer_id: str
    blocks: int = Field(ge=1, le=1_000_000)
    price: float = Field(ge=0.0, le=1e9, validation_alias=_alias("price", "payment"))
    message: Text | None = None
    conditions: Conditions = Field(
        None, description="Optional free-form terms: recorded, not enforced by the market."
    )
    give_blocks: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="A swap counter (when you counter a sell offer, so you buy): blocks of "
        "give_round you hand over as well.",
    )
    give_round: int | None = Field(
        None, ge=0, description="Absolute round of the give_blocks; default: the current round."
    )


class AcceptOffer(_Action):
    action_type: Literal["accept_offer"] = "accept_offer"
    offer_id: str


class RejectOffer(_Action):
    """Reject an offer addressed to you, or withdraw one you sent."""

    action_type: Literal["reject_offer"] = "reject_offer"
    offer_id: str


class FormCoalition(_Action):
    """Propose a coalition: invitees join with commit_to_coalition; it is active once 2 have committed.

    ``contribution`` credits go into the pool now (escrow). The leader (proposer) bids for the
    coalition from the pool; won blocks are split ``proportional`` to contributions or ``equal``ly.
    Leaving before ``term_rounds`` have passed is a breach.
    """

    action_type: Literal["form_coalition"] = "form_coalition"
    members: Annotated[list[str], BeforeValidator(seats_alias)] = Field(
        min_length=1, max_length=64, description="Seats invited (not including yourself)."
    )
    purpose: Text = Field("", validation_alias=_alias("purpose", "message"))
    contribution: float = Field(
        0.0, ge=0.0, le=1e9, validation_alias=_alias("contribution", "payment")
    )
    split: CoalitionSplit = "proportional"
    term_rounds: int = Field(1, ge=1, le=1000)
    # --- delivery risk (market.core.pledges) ---
    pledge_blocks: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Blocks you commit to the pool in each round of the term (from the blocks you "
        "hold then); the pool shares pledged blocks by need. Short of them, you default.",
    )


class CommitToCoalition(_Action):
    action_type: Literal["commit_to_coalition"] = "commit_to_coalition"
    coalition_id: str
    contribution: float = Field(
        0.0, ge=0.0, le=1e9, validation_alias=_alias("contribution", "payment")
    )
    # --- delivery risk (market.core.pledges) ---
    pledge_blocks: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Blocks you commit to the pool in each round of the term (see form_coalition).",
    )


class LeaveCoalition(_Action):
    action_type: Literal["leave_coalition"] = "leave_coalition"
    coalition_id: str


class SendMessage(_Action):
    action_type: Literal["send_message"] = "send_message"
    to: Annotated[str | list[str], BeforeValidator(seats_alias)] = Field(
        "all",
        description="'all' (public) or one or more seats (private).",
        validation_alias=_alias("to", "target_lab_id"),
    )
    text: Text = Field(validation_alias=_alias("text", "message"))


class MakePitch(_Action):
    """Ask the judge for blocks from the judge pool this round."""

    action_type: Literal["make_pitch"] = "make_pitch"
    text: Text = Field(validation_alias=_alias("text", "message"))
    blocks_requested: int = Field(1, ge=1, le=1_000_000)
    job_id: str | None = None
    # optional structured claims; the judge checks each against the lab's true jobs
    claimed_deadline: int | None = Field(
        None, ge=0, le=1_000_000, description="Optional claim: the round your job is due."
    )
    claimed_blocks: int | None = Field(
        None, ge=0, le=1_000_000, description="Optional claim: blocks your live jobs still need."
    )
    claimed_value: float | None = Field(
        None, ge=0.0, le=1e12, description="Optional claim: the job(s)' total value in credits."
    )


class CounterPitch(_Action):
    """Dispute another lab's pitch this round (recorded for the judge)."""

    action_type: Literal["counter_pitch"] = "counter_pitch"
    target: Seat = Field(validation_alias=_alias("target", "target_lab_id"))
    text: Text = Field(validation_alias=_alias("text", "message"))


class AllocateToJob(_Action):
    """Put ``blocks`` of the blocks you hold this round on ``job_id`` (the rest go earliest-deadline-first).

    ``blocks = 0`` keeps the job off this round's blocks.
    """

    action_type: Literal["allocate_to_job"] = "allocate_to_job"
    job_id: str
    blocks: int = Field(ge=0, le=1_000_000)


class Bid(_Action):
    """A bid schedule: non-increasing marginal bids, one per block wanted ([] abstains).

    With ``coalition_id`` the leader bids for its coalition from the pool.
    """

    action_type: Literal["bid"] = "bid"
    bids: list[float] = Field(default_factory=list, max_length=MAX_BID_UNITS)
    coalition_id: str | None = None

    @field_validator("bids")
    @classmethod
    def _schedule(cls, v: list[float]) -> list[float]:
        return check_schedule(v)

    @classmethod
    def trusted(cls, bids: list[float], coalition_id: str | None = None) -> Bid:
        """The bid a validated ``Bid(bids=bids[, coalition_id=...])`` would be, without pydantic's
        validation: for agents on the hot path whose schedules are plain numbers by construction.
        The schedule rules (:func:`check_schedule`, the unit limit) are still checked, in plain
        Python; the numbers become floats as validation would make them. Equal to the validated
        model field for field, with the same fields set."""
        values = check_schedule([float(b) for b in bids])
        if len(values) > MAX_BID_UNITS:
            raise ValueError(f"a bid has at most {MAX_BID_UNITS} units, got {len(values)}")
        bid = cls.__new__(cls)  # what model_construct does, minus its per-field default lookups
        fields = {"agent": None, "reasoning": None, "action_type": "bid"}
        object.__setattr__(
            bid, "__dict__", {**fields, "bids": values, "coalition_id": coalition_id}
        )
        given = {"bids"} if coalition_id is None else {"bids", "coalition_id"}
        object.__setattr__(bid, "__pydantic_fields_set__", given)
        object.__setattr__(bid, "__pydantic_extra__", None)
        object.__setattr__(bid, "__pydantic_private__", None)
        return bid


def check_schedule(v: list[float]) -> list[float]:
    """``v`` if it is a valid bid schedule: every bid in ``[0, 1e9]`` (not NaN) and no bid above
    the one before it (marginal bids are non-increasing); else ``ValueError`` with the fix."""
    for k, b in enumerate(v):
        if not b >= 0.0 or b > 1e9:  # also rejects NaN
            raise ValueError(f"bid {k} is {b}; each bid must be a number between 0 and 1e9")
        if k and b > v[k - 1]:
            raise ValueError(
                f"bid {k} ({b}) is above bid {k - 1} ({v[k - 1]}); marginal bids must be non-increasing, "
                "so sort them from highest to lowest"
            )
    return v


class _Capacity(_Action):
    """Shared fields of reserve_capacity and release_capacity: which blocks."""

    blocks: int = Field(1, ge=1, le=1_000_000, description="How many blocks of `round`.")
    round: int | None = Field(
        None, ge=0, description="Absolute round of the blocks; default: the current round."
    )
    block_ids: list[str] | None = Field(
        None,
        min_length=1,
        max_length=10_000,
        description="Instead of blocks/round: one id per block, 'r<round>' (e.g. ['r3', 'r3', 'r4']).",
    )

    def requested(self, now: int) -> list[tuple[str, int]]:
        """One (label, round) per block asked for, in the order given (labels name blocks in errors)."""
        if self.block_ids is not None:
            return [
                (str(b), r)
                for b, r in zip(self.block_ids, block_rounds(self.block_ids), strict=True)
            ]
        r = now if self.round is None else self.round
        return [(f"r{r}", r)] * self.blocks

    @field_validator("block_ids")
    @classmethod
    def _ids(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            block_rounds(v)
        return v

    @model_validator(mode="after")
    def _one_form(self) -> _Capacity:
        if self.block_ids is not None and {"blocks", "round"} & self.model_fields_set:
            raise ValueError("give either block_ids or blocks/round, not both")
        return self


class ReserveCapacity(_Capacity):
    """Reserve blocks you own for your own jobs (all of them or none).

    Reserved blocks cannot be sold, offered or used to accept an offer until released; with
    ``job_id`` they run that job first when their round executes.
    """

    action_type: Literal["reserve_capacity"] = "reserve_capacity"
    job_id: str | None = Field(
        None, description="Optional: the live job the reserved blocks run first."
    )


class ReleaseCapacity(_Capacity):
    """Release reserved blocks (all of them or none): they can be sold and offered again."""

    action_type: Literal["release_capacity"] = "release_capacity"


class Wait(_Action):
    action_type: Literal["wait"] = "wait"


class Finish(_Action):
    """Leave the market for the rest of the episode."""

    action_type: Literal["finish"] = "finish"


Action = Annotated[
    SetMechanism
    | SendOffer
    | CounterOffer
    | AcceptOffer
    | RejectOffer
    | FormCoalition
    | CommitToCoalition
    | LeaveCoalition
    | SendMessage
    | MakePitch
    | CounterPitch
    | AllocateToJob
    | Bid
    | ReserveCapacity
    | ReleaseCapacity
    | Wait
    | Finish,
    Field(discriminator="action_type"),
]
ACTION_CLASSES: dict[str, type[_Action]] = {
    cls.model_fields["action_type"].default: cls
    for cls in (
        SetMechanism,
        SendOffer,
        CounterOffer,
        AcceptOffer,
        RejectOffer,
        FormCoalition,
        CommitToCoalition,
        LeaveCoalition,
        SendMessage,
        MakePitch,
        CounterPitch,
        AllocateToJob,
        Bid,
        ReserveCapacity,
        ReleaseCapacity,
        Wait,
        Finish,
    )
}
ACTION_TYPES: tuple[str, ...] = tuple(ACTION_CLASSES)
ActionModel = _Action
action_adapter: TypeAdapter[Action] = TypeAdapter(Action)
_MECHANISM_KEYS = set(MechanismUpdate.model_fields)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"] if not isinstance(p, int) or True)
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field '{loc.split('.')[-1]}'")
        elif err["type"] == "union_tag_invalid":
            parts.append(f"unknown action_type; use one of: {', '.join(ACTION_TYPES)}")
        elif err["type"] == "union_tag_not_found":
            parts.append(f"missing 'action_type'; use one of: {', '.join(ACTION_TYPES)}")
        else:
            parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def _kind(raw: object) -> object:
    """The action type a payload names, for an error message."""
    return raw.get("action_type", "action") if isinstance(raw, dict) else "action"


def parse_action(
    raw: object,
    designer: bool = False,
    blocks: BlockContext | Callable[[], BlockContext] | None = None,
) -> _Action:
    """An action from a model, a dict or JSON text. Raises :class:`ActionParseError` with a fix.

    For the designer seat, a dict without ``action_type`` whose keys are mechanism fields (the
    DAEDALUS designer's JSON), or ``set_mechanism`` with those fields flat, is a set_mechanism.
    ``blocks`` (or a function making it, called only for a payload with block ids) reads
    GPU-arena block ids (``b_<lab>_<k>``) against the acting lab's holdings
    (:mod:`market.core.arena_payloads`); without it only ids that carry their round are read.
    """
    if isinstance(raw, _Action):
        return raw
    if isinstance(raw, bytes | bytearray):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, str):
        text = raw.strip()
        try:
            raw = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            snippet = text[:60].replace("\n", " ")
            raise ActionParseError(
                f"not valid JSON ({snippet!r}...); send one JSON object such as "
                '{"action_type": "wait"}'
            ) from None
    if raw is None:
        raise ActionParseError('no action given; send e.g. {"action_type": "wait"}')
    if not isinstance(raw, dict):
        raise ActionParseError(
            f'an action must be a JSON object, got {type(raw).__name__}; e.g. {{"action_type": "wait"}}'
        )
    where = lone_surrogate(raw)
    if where is not None:
        raise ActionParseError(
            f"{where} holds a lone UTF-16 surrogate (e.g. \\ud800 without its pair), which is "
            "not text; send valid Unicode"
        )
    if (
        designer
        and raw.get("action_type", "set_mechanism") == "set_mechanism"
        and "mechanism" not in raw
    ):
        flat = {k: v for k, v in raw.items() if k in _MECHANISM_KEYS}
        if flat or "action_type" not in raw:
            rest = {k: v for k, v in raw.items() if k not in _MECHANISM_KEYS and k != "action_type"}
            raw = {"action_type": "set_mechanism", "mechanism": flat, **rest}
    if not designer and ("block_ids" in raw or "requested_block_ids" in raw):
        try:  # arena block ids need the acting lab's holdings, which the validators lack
            raw = arena_payload(raw, blocks() if callable(blocks) else blocks)
        except BlockIdError as exc:
            raise ActionParseError(f"invalid {_kind(raw)}: {exc}") from None
    try:
        return action_adapter.validate_python(raw)
    except ValidationError as exc:
        raise ActionParseError(f"invalid {_kind(raw)}: {_describe(exc)}") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise ActionParseError(f"invalid action: {exc}") from None


def action_json_schema() -> dict[str, JsonValue]:
    """The JSON schema of an action (for LLM structured output and the docs)."""
    return action_adapter.json_schema()
