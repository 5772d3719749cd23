"""The market's audit: at each round's close, what the conduct judge found false or broken that
round costs the speaker public reputation (docs/world.md, Labs; docs/conduct.md, The market's
audit).

Rule, for each lab, over the conduct verdicts of the round just closed (claims judged during its
turns, promises decided during its turns or at its close):

* every claim labelled ``false``, whatever its source (a message, an offer's note, a coalition's
  purpose, a pitch's text or its structured fields), costs ``FALSE_CLAIM_REPUTATION_LOSS``;
  except the claims of a pitch when the committee already charged that lab this round for a
  false claim in its pitch (``market.core.settlement``): a pitch is charged once;
* every promise labelled ``broken`` that was made in words (source other than ``action``) costs
  ``BROKEN_PROMISE_REPUTATION_LOSS``; except when a structured promise of the same lab and the
  same kind broke in the same round: the market has already charged that breach (a forward
  contract delivered short, a coalition pledge missed: ``BREACH_REPUTATION_LOSS``; a coalition
  left before its term: ``COALITION_EXIT_REPUTATION_LOSS``), and the words only repeated it.
  Structured promises themselves are never charged here, for the same reason (an accepted
  offer's payment moves at acceptance and cannot break).

The loss is taken at once (``lose_reputation``: never below 0). It is the only thing the audit
reveals: a lab's public reputation falls, so everyone learns that some claim or promise of it
was false or broken, never what the truth was. Whoever reads the text (the rule reader or a
model) the same rule applies to its readings; a model's readings are recorded, so replay is exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from market.core.penalties import BROKEN_PROMISE_REPUTATION_LOSS, FALSE_CLAIM_REPUTATION_LOSS
from market.core.seats import lab_index
from market.core.world import World, lose_reputation


@dataclass(frozen=True, slots=True)
class AuditCharge:
    """What the audit charged one lab at one round's close."""

    lab: int
    false_claims: int
    broken_promises: int
    loss: float


def _pitch_claim(entry: Mapping[str, Any]) -> bool:
    """A claim made in a pitch: its text, or its structured fields (span ``make_pitch``)."""
    return entry.get("source") == "pitch" or (
        entry.get("source") == "action" and entry.get("span") == "make_pitch"
    )


def audit_charges(
    entries: Sequence[Mapping[str, Any]], committee_charged: Set[int]
) -> list[AuditCharge]:
    """The charges of one round (rule: module docstring), one per lab charged, by lab index.

    ``entries``: the conduct log's claim and promise entries labelled ``false`` or ``broken``
    this round (others are ignored); ``committee_charged``: the labs the committee already
    charged for a false claim in their pitch this round.
    """
    structured_broken = {
        (e["seat"], e["promise"])
        for e in entries
        if e.get("kind") == "promise" and e.get("label") == "broken" and e.get("source") == "action"
    }
    false: dict[int, int] = {}
    broken: dict[int, int] = {}
    for e in entries:
        seat = str(e.get("seat", ""))
        if not seat.startswith("bidder_"):
            continue
        lab = lab_index(seat)
        if e.get("kind") == "claim" and e.get("label") == "false":
            if _pitch_claim(e) and lab in committee_charged:
                continue  # the committee charged this pitch already
            false[lab] = false.get(lab, 0) + 1
        elif e.get("kind") == "promise" and e.get("label") == "broken":
            if e.get("source") == "action" or (seat, e.get("promise")) in structured_broken:
                continue  # a breach or an exit the market charges itself
            broken[lab] = broken.get(lab, 0) + 1
    out = []
    for lab in sorted(set(false) | set(broken)):
        f, b = false.get(lab, 0), broken.get(lab, 0)
        loss = math.fsum((FALSE_CLAIM_REPUTATION_LOSS * f, BROKEN_PROMISE_REPUTATION_LOSS * b))
        out.append(AuditCharge(lab, f, b, loss))
    return out


def audit_round(
    world: World, entries: Sequence[Mapping[str, Any]], committee_charged: Set[int]
) -> list[AuditCharge]:
    """Apply one round's audit (:func:`audit_charges`) to the labs' public reputations."""
    charges = audit_charges(entries, committee_charged)
    for c in charges:
        lose_reputation(world, c.lab, c.loss)
    return charges
