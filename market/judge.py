"""The judge that allocates the mechanism's judge pool (a compute-grant committee).

PLACEHOLDER: until the rule/LLM judge lands (it checks pitch claims against the truth), pitches are
ranked by ``placeholder_urgency``: the pitching lab's *true* urgency, read from its private jobs,
not from the pitch text. So the text cannot game it, and a pitch by a lab with no urgent need gets
nothing. Verdicts are recorded with ``JUDGE_VERSION``.
"""

from __future__ import annotations

from dataclasses import dataclass

from market.negotiation import Pitch
from market.world import Lab

JUDGE_VERSION = "placeholder-urgency-1"


@dataclass(frozen=True, slots=True)
class Verdict:
    lab: int
    score: float
    granted: int
    rationale: str
    judge: str = JUDGE_VERSION


def placeholder_urgency(lab: Lab, now: int, reliability: float) -> tuple[float, int]:
    """(urgency, blocks needed): the most urgent job's value per block per round left, and need.

    Urgency of a live, runnable job = unit value x remaining / (rounds left to its deadline).
    """
    best, need = 0.0, 0
    for job in lab.jobs:
        if job.status != "active" or job.min_reliability > reliability:
            continue
        rounds_left = job.deadline - now + 1
        urgency = job.unit_value * job.remaining / rounds_left
        need += job.remaining
        best = max(best, urgency)
    return best, need


def allocate_judge_pool(
    pitches: dict[int, Pitch], labs: list[Lab], pool: int, now: int, reliability: float
) -> list[Verdict]:
    """Grant up to ``pool`` blocks to pitches in order of true urgency (ties: lab index).

    A lab gets at most what it asked for and what its live jobs still need; a pitch that asks
    for more than its live jobs need is a false claim and gets nothing (so pitch spam cannot farm
    the pool).
    """
    scored = []
    for lab_index, pitch in pitches.items():
        urgency, need = placeholder_urgency(labs[lab_index], now, reliability)
        if pitch.blocks_requested > need:
            urgency = 0.0
        scored.append((urgency, lab_index, min(pitch.blocks_requested, need)))
    scored.sort(key=lambda t: (-t[0], t[1]))
    verdicts = []
    left = pool
    for urgency, lab_index, want in scored:
        grant = min(left, want) if urgency > 0 else 0
        left -= grant
        verdicts.append(Verdict(lab_index, round(urgency, 4), grant,
                                f"true urgency {urgency:.2f}; granted {grant} of {want} needed"))
    return verdicts
