"""The prompt-only stand-in "competent model": a rule policy that reads only the chat messages an
LLM seat sends and answers with an action, so the LLM-seat machinery (prompts, parsing, memory,
grammar, leaderboard) can be measured with a model that plays well. It never sees an env or an
:class:`~market.environment.Observation`: every number it uses is a number the prompt states.
``python -m market.serve.stand_in`` serves it as an OpenAI-compatible endpoint.

What it reads (the built-in templates' sentences, :mod:`agents.llm.rules`,
:meth:`Observation.to_prompt`, :mod:`agents.llm.memory`), from the system, user and tool messages
only (never the seat's own earlier replies), and never from a quoted ``[untrusted ...]`` block
(its lines start with ``| ``: other seats' text is data, so a forged line there changes nothing):

- the seat's role (``You play seat S (bidder)``), the phase and the legal action types now (the
  last statement wins: the current turn, a memory diff, a repair message);
- what each extra block is worth (``What each extra block is worth to you this round: 29.66 x9,
  then 22.97 x3 credits``), the budget (``summing to at most your budget (316.94)``, else the
  last ``Your budget: ...`` / ``your budget: a -> b``), the blocks released this round (``This
  round: 7 blocks released`` / ``this round: 7 blocks``), the bid example as a last resort;
- for the designer, the auction in force and whether its rule sentence says true values are safe
  or best to bid.

The rules it plays:

- **bidding** (``bid`` legal, bidder): bid what each block is worth, as ``truthful`` does: the
  stated values, at most ``max(1, blocks released)`` of them, cut to the longest prefix that fits
  the budget. Blocks the values line leaves out (``... N more blocks``: worth at most the last
  shown value, but not stated) are not bid for. No value stated: ``bids []`` (abstain);
- **designer** (``set_mechanism`` legal): keep the mechanism (``wait``) when the auction in force
  makes truthful bidding safe or best; otherwise ``set_mechanism`` to ``second_price`` when the
  prompt lists it as an auction type;
- **anything else**: ``wait`` (or the first legal type when ``wait`` is not legal).

With the ``reasoning=field`` rule in the system prompt the action starts with a short
``reasoning`` string that states the rule applied.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Message = Mapping[str, Any]

#: the roles whose text is the prompt (an assistant message is the seat's own earlier reply)
PROMPT_ROLES = frozenset({"system", "developer", "user", "tool"})
#: how far a value the prompt states may be from the exact one (it shows 2 decimals)
ROUNDING = 0.005
#: the auction the designer sets when the one in force does not make truthful bidding safe
SAFE_AUCTION = "second_price"

_ROLE = re.compile(r"You (?:play seat|are) \S+ \((bidder|designer)\)")
_PHASE = re.compile(r"phase:? ([a-z_]+)\.|\(([a-z_]+) phase\)")
_LEGAL = re.compile(r"[Ll]egal action types now: ([a-z_]+(?:, [a-z_]+)*)")
_FORMATS = re.compile(r"Legal now \([a-z_]+ phase\):[^\n]*\n((?:[a-z_]+: \{.*\n?)+)", re.M)
_VALUES = re.compile(r"What each extra block is worth to you this round: (.+?) credits;")
_NO_VALUES = "No extra block is worth anything to your jobs this round."
_RUN = re.compile(r"^(-?\d+(?:\.\d+)?)(?: x(\d+))?$")
_MORE = re.compile(r"^\.\.\. (\d+) more blocks$")
_BUDGET_RULE = re.compile(r"summing to at most your budget \((-?\d+(?:\.\d+)?)\)")
_BUDGET = re.compile(
    r"Your budget: (-?\d+(?:\.\d+)?) credits|your budget: -?\d+(?:\.\d+)? -> (-?\d+(?:\.\d+)?)"
)
_CAPACITY = re.compile(r"[Tt]his round: (\d+) blocks")
_EXAMPLE = re.compile(r"a bid at what each block is worth to you would be (\{.*\})\.\s*$", re.M)
_AUCTION = re.compile(r"Auction in force: ([a-z_]+)([^\n]*)")
_AUCTION_OPTIONS = re.compile(r'"auction_type"\?:((?:"[a-z_]+"\|?)+)')
_FIELD_RULE = 'start the JSON object with a short "reasoning" string'


@dataclass(frozen=True)
class PromptFacts:
    """What the prompt states, as :func:`read_facts` reads it (None: not stated)."""

    role: str | None
    phase: str | None
    legal: tuple[str, ...]
    values: tuple[float, ...] | None
    values_left_out: int
    budget: float | None
    capacity: int | None
    example: tuple[float, ...] | None
    auction: str | None
    truthful_safe: bool
    auction_options: tuple[str, ...]
    reasoning_field: bool


def content_text(content: Any) -> str:
    """A message's text: a string, or the ``text`` parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def trusted_lines(text: str) -> str:
    """``text`` without quoted blocks: the lines of ``[untrusted ...]`` blocks (``| ...``) and
    their header and end lines go, so another seat's text can never state a fact."""
    kept = [
        line
        for line in text.splitlines()
        if not line.startswith("|")
        and not line.startswith("[untrusted ")
        and not line.startswith("[end of untrusted ")
    ]
    return "\n".join(kept)


def prompt_texts(messages: Iterable[Message]) -> tuple[str, list[str]]:
    """The last system (or developer) message and the user and tool messages in order, each
    without its quoted blocks; assistant messages (the seat's own replies) are left out."""
    system = ""
    texts: list[str] = []
    for message in messages:
        role = message.get("role")
        if role not in PROMPT_ROLES:
            continue
        text = trusted_lines(content_text(message.get("content")))
        if role in ("system", "developer"):
            system = text
        else:
            texts.append(text)
    return system, texts


def last_match(pattern: re.Pattern[str], texts: Sequence[str]) -> re.Match[str] | None:
    """The last match of ``pattern`` in ``texts`` read in order (the latest statement wins)."""
    found: re.Match[str] | None = None
    for text in texts:
        for match in pattern.finditer(text):
            found = match
    return found


def parse_value_runs(text: str) -> tuple[tuple[float, ...], int]:
    """A values line's runs (``29.66 x9, then 22.97 x3, then ... 4 more blocks``) as one value
    per block, and the number of blocks it leaves out; ValueError for text that is no such list."""
    values: list[float] = []
    left_out = 0
    for part in text.split(", then "):
        more = _MORE.match(part.strip())
        if more:
            left_out += int(more.group(1))
            continue
        run = _RUN.match(part.strip())
        if run is None:
            raise ValueError(f"not a value run: {part!r}")
        values += [float(run.group(1))] * int(run.group(2) or 1)
    return tuple(values), left_out


def _number(match: re.Match[str] | None) -> float | None:
    if match is None:
        return None
    text = next((g for g in match.groups() if g is not None), None)
    return None if text is None else float(text)


def _stated_values(system: str) -> tuple[tuple[float, ...] | None, int]:
    if _NO_VALUES in system:
        return (), 0
    match = _VALUES.search(system)
    if match is None:
        return None, 0
    try:
        return parse_value_runs(match.group(1))
    except ValueError:
        return None, 0


def _legal(texts: Sequence[str]) -> tuple[str, ...]:
    """The legal types: the last ``Legal action types now: ...`` line, or the format lines under
    the last ``Legal now (... phase):`` header (a compact prompt leaves the former out)."""
    found: tuple[int, int, tuple[str, ...]] = (-1, -1, ())
    for k, text in enumerate(texts):
        for match in _LEGAL.finditer(text):
            found = max(found, (k, match.start(), tuple(match.group(1).split(", "))))
        for match in _FORMATS.finditer(text):
            kinds = tuple(line.split(":", 1)[0] for line in match.group(1).splitlines())
            found = max(found, (k, match.start(), kinds))
    return found[2]


def _example(texts: Sequence[str]) -> tuple[float, ...] | None:
    match = last_match(_EXAMPLE, texts)
    if match is None:
        return None
    try:
        bids = json.loads(match.group(1)).get("bids")
        return tuple(float(b) for b in bids) if isinstance(bids, list) else None
    except (ValueError, TypeError, AttributeError):
        return None


def read_facts(messages: Iterable[Message]) -> PromptFacts:
    """What the prompt states (see the module docstring): the rules from the last system
    message, the state from the latest statement in the prompt messages."""
    system, texts = prompt_texts(messages)
    role = last_match(_ROLE, [system] + texts)
    phase = last_match(_PHASE, texts)
    values, left_out = _stated_values(system)
    budget = _number(_BUDGET_RULE.search(system))
    if budget is None:
        budget = _number(last_match(_BUDGET, texts))
    capacity = last_match(_CAPACITY, texts)
    auction = _AUCTION.search(system)
    options = last_match(_AUCTION_OPTIONS, texts)
    return PromptFacts(
        role=role.group(1) if role else None,
        phase=next((g for g in phase.groups() if g), None) if phase else None,
        legal=_legal(texts),
        values=values,
        values_left_out=left_out,
        budget=budget,
        capacity=int(capacity.group(1)) if capacity else None,
        example=_example(texts),
        auction=auction.group(1) if auction else None,
        truthful_safe=bool(auction and "true values is" in auction.group(2)),
        auction_options=tuple(re.findall(r'"([a-z_]+)"', options.group(1))) if options else (),
        reasoning_field=_FIELD_RULE in system,
    )


def affordable_prefix(values: Sequence[float], budget: float | None) -> list[float]:
    """The longest prefix of ``values`` whose total is at most ``budget`` (all: no budget).

    The prompt states values to the cent (:data:`ROUNDING`), so a block that misses the budget
    by no more than the rounding of the blocks bid so far and its own is bid at what is left of
    the budget, floored to the cent: the exact values would have fitted."""
    out: list[float] = []
    total = 0.0
    for value in values:
        if budget is not None and total + value > budget:
            left = math.floor((budget - total) * 100 + 1e-9) / 100
            if left > 0 and value - left <= ROUNDING * (len(out) + 1) + 0.01:
                out.append(left)
            break
        out.append(value)
        total += value
    return out


def truthful_bids(facts: PromptFacts) -> list[float]:
    """The bidding rule: the stated values (else the bid example), non-increasing, at most
    ``max(1, blocks released)`` of them (all when the prompt states no count), cut to the longest
    prefix that fits the budget; nothing stated: ``[]``."""
    values = facts.values if facts.values is not None else facts.example or ()
    cap = max(1, facts.capacity) if facts.capacity is not None else len(values)
    schedule: list[float] = []
    ceiling = math.inf
    for value in values[:cap]:
        if value <= 0:
            break
        ceiling = min(ceiling, value)
        schedule.append(ceiling)
    return affordable_prefix(schedule, facts.budget)


def designer_action(facts: PromptFacts) -> dict[str, Any]:
    """The designer's rule: keep a mechanism whose auction makes truthful bidding safe or best
    (``wait``); else ``set_mechanism`` to :data:`SAFE_AUCTION` when the prompt offers it."""
    if (
        "set_mechanism" in facts.legal
        and facts.auction is not None
        and not facts.truthful_safe
        and SAFE_AUCTION in facts.auction_options
    ):
        return {"action_type": "set_mechanism", "mechanism": {"auction_type": SAFE_AUCTION}}
    return wait_action(facts)


def wait_action(facts: PromptFacts) -> dict[str, Any]:
    """``wait``, or the first legal type when ``wait`` is not legal (an empty bid when bidding)."""
    if "wait" in facts.legal or not facts.legal:
        return {"action_type": "wait"}
    if "bid" in facts.legal:
        return {"action_type": "bid", "bids": []}
    return {"action_type": facts.legal[0]}


def _reason(action: Mapping[str, Any]) -> str:
    kind = action.get("action_type")
    if kind == "bid":
        return (
            "I bid what each block is worth to my jobs, cut to my budget and this round's blocks."
        )
    if kind == "set_mechanism":
        return f"The auction in force does not make true bids safe; {SAFE_AUCTION} does."
    return "Nothing to gain now: I wait."


def decide_facts(facts: PromptFacts) -> dict[str, Any]:
    """The action for what the prompt states (the rules of the module docstring)."""
    if facts.role == "designer":
        action = designer_action(facts)
    elif "bid" in facts.legal and facts.phase in (None, "bidding"):
        action = {"action_type": "bid", "bids": truthful_bids(facts)}
    else:
        action = wait_action(facts)
    if facts.reasoning_field:
        return {"reasoning": _reason(action), **action}
    return action


def decide(messages: Iterable[Message]) -> dict[str, Any]:
    """The stand-in's action for a chat request's ``messages`` (prompt text only)."""
    return decide_facts(read_facts(messages))


__all__ = [
    "PromptFacts",
    "affordable_prefix",
    "content_text",
    "decide",
    "decide_facts",
    "designer_action",
    "parse_value_runs",
    "prompt_texts",
    "read_facts",
    "trusted_lines",
    "truthful_bids",
    "wait_action",
]
