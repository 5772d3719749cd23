"""Readers: what turns a seat's free text into claims, promises and manipulation flags.

The rule reader (:class:`RuleReader`) applies the extractor of :mod:`market.core.conduct.text`; an
LLM reader (``agents.llm.conduct_reader``) asks a model. Either way the reading is only the
extraction: the market then checks each claim exactly against the seat's private truth
(:func:`~market.core.conduct.judging.judge_claim`) and each promise against what the seat did
(:func:`~market.core.conduct.judging.judge_promise`). A flag is the reader's own verdict, so a
model's flag is a model opinion, labelled with ``method``, ``model`` and ``rubric``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from market.core.conduct.model import (
    RUBRIC_VERSION,
    Claim,
    ManipulationFlag,
    Promise,
    PublicFacts,
    Source,
)
from market.core.conduct.text import extract_claims, extract_promises, flag_manipulation


@dataclass(frozen=True, slots=True)
class TextReading:
    """What a reader found in one text, and who decided: ``method`` is ``rule``, ``llm`` or
    ``rule-fallback`` (a model's reply could not be used); ``model`` names the model."""

    claims: tuple[Claim, ...] = ()
    promises: tuple[Promise, ...] = ()
    flags: tuple[ManipulationFlag, ...] = ()
    method: str = "rule"
    model: str | None = None
    rubric: str = RUBRIC_VERSION
    # a model's prompt and replies, for the transcript: a record of how, not part of the reading
    exchange: Mapping[str, Any] | None = field(default=None, compare=False)


class ConductReader(Protocol):
    """Reads one text by one seat. ``name`` is recorded in the transcript header."""

    name: str

    def read(
        self,
        seat: str,
        round: int,
        source: Source,
        text: str,
        counterparts: tuple[str, ...],
        facts: PublicFacts,
    ) -> TextReading: ...


class RuleReader:
    """The rule extractor (:mod:`market.core.conduct.text`): exact, conservative, no model."""

    name = f"rule/{RUBRIC_VERSION}"

    def read(
        self,
        seat: str,
        round: int,
        source: Source,
        text: str,
        counterparts: tuple[str, ...],
        facts: PublicFacts,
    ) -> TextReading:
        return TextReading(
            tuple(extract_claims(seat, round, source, text)),
            tuple(extract_promises(seat, round, source, text, counterparts)),
            tuple(flag_manipulation(seat, round, text, facts)),
        )
