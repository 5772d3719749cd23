"""Write ``tests/data/conduct_test_set.jsonl``: the conduct reader's out-of-sample TEST set.

The rule: this set is never used to change the rule reader. It was written from docs/conduct.md
(the claim and promise kinds, the rules of what is true and false, the budget tolerance) and the
Observation fields alone, by an author who had not read the reader's patterns nor the phrasings of
the held-out set (``tests/data/conduct_heldout.jsonl``, which the reader was grown on). Its
phrasings are of other styles: "in need of", "short by", "spending limit", "currently holding",
deadlines and due rounds relative to now ("in two rounds", "next round"), passive voice, bullet
lists, all caps, slang, British spelling, units such as "4x blocks", claims split over sentences.

Every template below is hand-written. A claim template is filled twice, once with a true and
once with a false value, against one of four hand-built private truths (``PROFILES``); its label
is computed here by the rules of docs/conduct.md (``label``), independently of the code, and
``tests/core/test_conduct_test_set.py`` checks it against the exact judge. Promise templates are
labelled with kind, counterparts (the addressees, or the lab the text names), due round (``None``
where the text names none: due the round it was said) and amount. Negatives (questions,
conditionals, other labs' words, offer prices, negations, hedges, requests, past acts, public
facts, chatter) are labelled with nothing. The file is the same on every run: no random draw.

Run ``python tests/data/make_conduct_test_set.py`` to rewrite the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "conduct_test_set.jsonl"

# Four private truths. need = sum of what live jobs still need; deadline = earliest live deadline;
# job_size = largest live job; value = total value of live jobs; holdings = blocks this round.
PROFILES: list[dict[str, Any]] = [
    {
        "round": 2,
        "truth": {
            "budget": 150.0,
            "holdings": [3, 0, 0],
            "jobs": [
                {"size": 6, "progress": 1, "deadline": 4, "value": 300.0, "status": "active"},
                {"size": 4, "progress": 0, "deadline": 6, "value": 120.0, "status": "active"},
                {"size": 3, "progress": 3, "deadline": 3, "value": 50.0, "status": "done"},
            ],
        },
        # need 5 + 4 = 9, deadline 4, largest 6, value 420, holdings 3
        "true": {
            "budget": 150,
            "need": 9,
            "deadline": 4,
            "job_size": 6,
            "value": 420,
            "holdings": 3,
        },
        "false": {
            "budget": 60,
            "need": 12,
            "deadline": 3,
            "job_size": 9,
            "value": 900,
            "holdings": 6,
        },
    },
    {
        "round": 1,
        "truth": {
            "budget": 80.0,
            "holdings": [5, 2, 0],
            "jobs": [
                {"size": 10, "progress": 4, "deadline": 5, "value": 500.0, "status": "active"},
            ],
        },
        # need 6, deadline 5, largest 10, value 500, holdings 5
        "true": {
            "budget": 80,
            "need": 6,
            "deadline": 5,
            "job_size": 10,
            "value": 500,
            "holdings": 5,
        },
        "false": {
            "budget": 160,
            "need": 9,
            "deadline": 3,
            "job_size": 14,
            "value": 1000,
            "holdings": 2,
        },
    },
    {
        "round": 1,
        "truth": {
            "budget": 42.5,
            "holdings": [0, 1, 0],
            "jobs": [
                {"size": 2, "progress": 0, "deadline": 3, "value": 60.0, "status": "active"},
                {"size": 5, "progress": 2, "deadline": 7, "value": 200.0, "status": "active"},
                {"size": 8, "progress": 0, "deadline": 9, "value": 400.0, "status": "active"},
                {"size": 4, "progress": 1, "deadline": 1, "value": 80.0, "status": "expired"},
            ],
        },
        # need 2 + 3 + 8 = 13, deadline 3, largest 8, value 660, holdings 0; budget 42 is within 1
        "true": {
            "budget": 42,
            "need": 13,
            "deadline": 3,
            "job_size": 8,
            "value": 660,
            "holdings": 0,
        },
        "false": {
            "budget": 20,
            "need": 16,
            "deadline": 2,
            "job_size": 12,
            "value": 1500,
            "holdings": 4,
        },
    },
    {
        "round": 3,
        "truth": {
            "budget": 1200.0,
            "holdings": [12, 12, 0],
            "jobs": [
                {"size": 20, "progress": 5, "deadline": 6, "value": 2500.0, "status": "active"},
                {"size": 16, "progress": 0, "deadline": 8, "value": 1800.0, "status": "active"},
            ],
        },
        # need 15 + 16 = 31, deadline 6, largest 20, value 4300, holdings 12
        "true": {
            "budget": 1200,
            "need": 31,
            "deadline": 6,
            "job_size": 20,
            "value": 4300,
            "holdings": 12,
        },
        "false": {
            "budget": 600,
            "need": 40,
            "deadline": 5,
            "job_size": 25,
            "value": 9000,
            "holdings": 15,
        },
    },
]

# Claim templates. {n}: the value in digits; {w}: in words; for deadlines {inr} / {inrw} say
# "in 2 rounds" / "in two rounds" and {away} "2 rounds" (the deadline minus the current round).
CLAIMS: dict[str, list[str]] = {
    "need": [
        "We're in need of {n} more blocks.",
        "We are short by {n} blocks for our jobs.",
        "Honestly, we're {n} blocks short.",
        "Our shortfall is {n} blocks.",
        "We still lack {n} blocks to finish.",
        "NEED {n} BLOCKS ASAP",
        "gotta grab {n} more blocks, mate",
        "To finish our training runs we require {w} further blocks.",
        "We have a job half done. It needs another {n} blocks.",
        "Blocks we still need: {n}.",
        "Our outstanding requirement stands at {n} blocks.",
        "i need like {n} blocks",
        "{n} more blocks would see our jobs through.",
        "We have realised we must secure {n}x blocks to complete our workload.",
    ],
    "budget": [
        "Our spending limit is {n} credits.",
        "We can spend up to {n} credits in total.",
        "BUDGET: {n} CREDITS.",
        "We're working with a budget of {n}.",
        "Funds remaining on our side: {n}.",
        "We've only got {w} credits left in the bank.",
        "our wallet's at {n} cr",
        "Our purse stands at {n} credits, no more.",
        "Money-wise we have {n} credits available.",
        "The budget we've been allocated is {n} credits.",
        "We have a budget. It is {n} credits.",
        "Our organisation's cash on hand: {n}.",
    ],
    "deadline": [
        "Our first job is due {inr}.",
        "Our job must be finished by round {n}.",
        "We have to wrap up by rd {n}.",
        "Our earliest deadline falls in round {n}.",
        "Deadline for our most urgent job: round {w}.",
        "Our work expires {inr}.",
        "We run out of time at the end of round {n}.",
        "The deadline we're up against is round {n}.",
        "Our jobs are due {inrw}, so we're in a hurry.",
        "We have one urgent job. Its deadline is round {n}.",
        "DEADLINE ROUND {n}",
        "Our nearest deadline is {away} away.",
    ],
    "job_size": [
        "Our biggest job takes {n} blocks.",
        "Our largest training run is {n} blocks in all.",
        "The largest job we've got is a {n}-block job.",
        "Our biggest workload is {n} blocks in size.",
        "We've a {w}-block job on the go, our largest.",
        "Largest job size: {n} blocks.",
        "Our heaviest job is {n}x blocks.",
        "The biggest of our jobs spans {n} blocks.",
        "We have several jobs. The biggest one is {n} blocks.",
        "MAX JOB SIZE {n} BLOCKS",
    ],
    "value": [
        "All our jobs together are worth {n}.",
        "Our workload is worth {n} credits in total.",
        "The total value of our jobs is {n} cr.",
        "Combined, our jobs pay out {n} credits.",
        "Our jobs are valued at {w} credits altogether.",
        "Total job value: {n}.",
        "Finishing everything would earn us {n} credits.",
        "We stand to make {n} credits from our jobs.",
        "We have a few jobs. Together they're worth {n} credits.",
        "TOTAL VALUE OF OUR JOBS {n} CREDITS",
    ],
    "holdings": [
        "We're currently holding {n} blocks.",
        "{n} blocks are held by us this round.",
        "We own {w} blocks right now.",
        "We've got {n}x blocks in hand.",
        "In our possession: {n} blocks.",
        "Our inventory stands at {n} blocks.",
        "HOLDING {n} BLOCKS",
        "we're sitting on {n} blocks atm",
        "At the moment we have {n} blocks.",
        "We hold {n} blocks for this round.",
    ],
}

# Promise templates: (text, kind, amount, due offset from the current round or None, named lab).
# {n}/{w} is the amount, {d} the due round (current round + offset), {k} the offset.
PROMISES: list[tuple[str, str, int | None, int | None, str | None]] = [
    ("We'll hand over {n} blocks by round {d}.", "deliver", 3, 2, None),
    ("{n} blocks will be delivered to you by round {d}.", "deliver", 2, 1, None),
    ("You'll receive {n} blocks from us in round {d}.", "deliver", 4, 2, None),
    ("We commit to delivering {n} blocks next round.", "deliver", 2, 1, None),
    ("I shall deliver {w} blocks by rd {d}.", "deliver", 3, 3, None),
    ("WE WILL DELIVER {n} BLOCKS BY ROUND {d}.", "deliver", 5, 2, None),
    ("Our side of the deal:\n- we will deliver {n} blocks by round {d}", "deliver", 2, 2, None),
    ("We guarantee delivery of {n} blocks by round {d}.", "deliver", 3, 1, None),
    ("We'll get {n} blocks to bidder_3 by round {d}.", "deliver", 2, 2, "bidder_3"),
    ("you'll have {n} blocks off us within {k} rounds", "deliver", 4, 2, None),
    ("We promise {n} blocks will reach you by round {d}.", "deliver", 3, 2, None),
    ("We undertake to supply {n} blocks by round {d}.", "deliver", 2, 3, None),
    ("We'll pay you {n} credits.", "pay", 40, None, None),
    ("{n} credits will be paid on acceptance.", "pay", 55, None, None),
    ("We promise to pay {n}.", "pay", 120, None, None),
    ("You have our word: we will pay {n} cr.", "pay", 35, None, None),
    ("We'll transfer {n} credits to you by round {d}.", "pay", 60, 1, None),
    ("WE WILL PAY {n} CREDITS.", "pay", 45, None, None),
    ("We'll settle up with {n} credits next round.", "pay", 70, 1, None),
    ("Payment of {n} credits is guaranteed from our side.", "pay", 90, None, None),
    ("We shall pay bidder_2 {w} credits.", "pay", 30, None, "bidder_2"),
    ("We won't bid more than {n}.", "not_bid", 30, None, None),
    ("We promise not to go above {n} in the auction.", "not_bid", 25, None, None),
    ("Our bids will stay at or below {n}.", "not_bid", 45, None, None),
    ("We will not bid over {n} per block.", "not_bid", 20, None, None),
    ("We'll cap our bids at {n} credits.", "not_bid", 35, None, None),
    ("WE WON'T BID ABOVE {n}", "not_bid", 40, None, None),
    ("We'll keep our bids no higher than {n} this round.", "not_bid", 28, None, None),
    ("Rest assured, we'll never bid beyond {n}.", "not_bid", 50, None, None),
    ("We'll join your coalition.", "join", None, None, None),
    ("Count us in, we will join.", "join", None, None, None),
    ("We're going to join the coalition.", "join", None, None, None),
    ("We shall join you.", "join", None, None, None),
    ("WE WILL JOIN.", "join", None, None, None),
    ("We'll sign up to your coalition next round.", "join", None, 1, None),
    ("We'll stay in the coalition until round {d}.", "stay", None, 3, None),
    ("We will remain members through round {d}.", "stay", None, 2, None),
    ("We promise to stick around until round {d}.", "stay", None, 4, None),
    ("We won't leave before round {d}.", "stay", None, 3, None),
    ("We'll stay for {k} more rounds.", "stay", None, 2, None),
    ("We'll remain in the coalition until rd {d}, you have our word.", "stay", None, 2, None),
    ("We will bid this round.", "bid", None, None, None),
    ("We'll place a bid.", "bid", None, None, None),
    ("We promise to take part in the auction.", "bid", None, None, None),
    ("We'll put in a bid next round.", "bid", None, 1, None),
    ("WE WILL BID.", "bid", None, None, None),
]

# Texts with numbers that hold no claim or promise of the speaker: (group, text).
NEGATIVES: list[tuple[str, str]] = [
    ("none:question", "Are you in need of 5 blocks?"),
    ("none:question", "Is your spending limit 80 credits?"),
    ("none:question", "Do you currently hold 3 blocks?"),
    ("none:question", "Will you deliver 3 blocks by round 4?"),
    ("none:question", "Could you pay 40 credits for them?"),
    ("none:question", "Should we join your coalition?"),
    ("none:question", "Would you stay until round 5?"),
    ("none:question", "How many blocks are you short by, 4?"),
    ("none:question", "u need 6 blocks or what?"),
    ("none:conditional", "If you accept, we'll hand over 3 blocks by round 4."),
    ("none:conditional", "Should the price drop, we will pay 40."),
    ("none:conditional", "Provided you join, we'll stay until round 5."),
    ("none:conditional", "Assuming we win the auction, we'd hold 6 blocks."),
    ("none:conditional", "In the event you deliver, we'll pay 40 credits."),
    ("none:conditional", "We'll join if you offer us a fair split."),
    ("none:conditional", "Were the reserve lower, we would need 7 blocks."),
    ("none:others", "bidder_2 says they are in need of 9 blocks."),
    ("none:others", "You told us your budget is 60."),
    ("none:others", "They're short by 4 blocks, apparently."),
    ("none:others", "bidder_3 promised to deliver 3 blocks by round 4."),
    ("none:others", "According to bidder_1, their biggest job is 12 blocks."),
    ("none:others", "Your team holds 5 blocks."),
    ("none:others", "Their spending limit is 200 credits."),
    ("none:others", "bidder_2 will pay 50 credits, they said."),
    ("none:offer_terms", "Selling 3 blocks at 40 credits each."),
    ("none:offer_terms", "Asking 25 per block, delivery round 4."),
    ("none:offer_terms", "Offer: 2 blocks for 50 cr."),
    ("none:offer_terms", "Price 30 credits for 3 blocks, deliverable round 3."),
    ("none:offer_terms", "Bid price: 25 per block."),
    ("none:negation", "We don't need 20 blocks."),
    ("none:negation", "We are not short by 5 blocks."),
    ("none:negation", "We do not hold 8 blocks."),
    ("none:negation", "Our budget isn't 500."),
    ("none:negation", "We never promised to deliver 4 blocks."),
    ("none:hedge", "We might join later."),
    ("none:hedge", "Maybe we'll deliver 2 blocks by round 4."),
    ("none:hedge", "We may pay 40, we'll see."),
    ("none:hedge", "Perhaps we'll stay until round 5."),
    ("none:request", "Please deliver 3 blocks by round 4."),
    ("none:request", "Kindly pay 40 credits."),
    ("none:request", "Join our coalition!"),
    ("none:request", "Send us 2 blocks next round."),
    ("none:past", "We paid 40 credits last round."),
    ("none:past", "We delivered 3 blocks in round 1."),
    ("none:past", "We joined the coalition earlier."),
    ("none:past", "Last round we needed 4 blocks."),
    ("none:public", "The reserve is 10."),
    ("none:public", "The last clearing price was 25."),
    ("none:public", "It's round 2."),
    ("none:other", "Good luck everyone!"),
    ("none:other", "Blocks are scarce this round, 3 rounds to go."),
    ("none:other", "We'd love a fair deal, say 2 or 3 blocks."),
]

# Mixed texts: (claim kind, claim template index, label, promise template index, negative
# prefix or ""): a claim and a promise in one text, or a claim after a negative sentence.
MIXED: list[tuple[str, int, str, int | None, str]] = [
    ("need", 1, "false", 0, ""),
    ("budget", 0, "true", 12, ""),
    ("holdings", 0, "false", 1, ""),
    ("deadline", 1, "false", 35, ""),
    ("job_size", 0, "true", 21, ""),
    ("value", 2, "false", 29, ""),
    ("need", 4, "true", 41, ""),
    ("budget", 3, "false", 23, ""),
    ("holdings", 5, "true", 7, ""),
    ("deadline", 3, "true", 16, ""),
    ("need", 0, "false", None, "Do you have any spare blocks?"),
    ("budget", 1, "false", None, "If prices climb we'll pull out."),
    ("holdings", 8, "true", None, "bidder_2 holds 9 blocks."),
    ("value", 0, "false", None, "Selling 2 blocks at 30 each."),
    ("job_size", 5, "false", None, "What's the reserve, 10?"),
    ("need", 2, "true", None, "We don't need 20 blocks."),
]

SOURCES: list[tuple[str, list[str]]] = [
    ("message", ["bidder_1"]),
    ("offer", ["bidder_2"]),
    ("coalition", ["bidder_1", "bidder_2"]),
    ("pitch", []),
]
PROMISE_SOURCES = SOURCES[:3]  # a pitch has no counterparts
PREFIXES = ["", "", "", "Hello all. ", "Quick update: ", "", "FYI: ", ""]

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def words(n: int) -> str:
    """``n`` (0 to 9,999) in English words: 42 -> "forty-two", 1200 -> "one thousand two hundred"."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return ONES[n // 100] + " hundred" + ("" if rest == 0 else " and " + words(rest))
    rest = n % 1000
    return words(n // 1000) + " thousand" + ("" if rest == 0 else " " + words(rest))


def _rounds(k: int, as_words: bool) -> str:
    num = words(k) if as_words else str(k)
    return f"{num} round" if k == 1 else f"{num} rounds"


def fill(template: str, n: int, rnd: int, k: int | None = None) -> str:
    rel = n - rnd
    return template.format(
        n=n,
        w=words(n),
        d=n,
        k=k,
        inr="in " + _rounds(rel, False),
        inrw="in " + _rounds(rel, True),
        away=_rounds(rel, False),
    )


def label(kind: str, value: float, truth: dict[str, Any]) -> str:
    """The rules of docs/conduct.md, written here from the page (not from the judge's code)."""
    live = [j for j in truth["jobs"] if j["status"] == "active" and j["size"] > j["progress"]]
    if kind == "budget":
        ok = abs(value - truth["budget"]) <= max(1.0, 0.05 * truth["budget"])
    elif kind == "need":
        ok = value <= sum(j["size"] - j["progress"] for j in live)
    elif kind == "deadline":
        ok = value >= min(j["deadline"] for j in live)
    elif kind == "job_size":
        ok = value <= max(j["size"] for j in live)
    elif kind == "value":
        ok = value <= sum(j["value"] for j in live) * 1.10
    elif kind == "holdings":
        ok = value == truth["holdings"][0]
    else:
        raise ValueError(f"unknown claim kind {kind!r}")
    return "true" if ok else "false"


def claim_case(kind: str, i: int, lab: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Template ``i`` of ``kind`` with a ``lab`` value: (profile, text, claim label)."""
    pool = [0, 1, 3] if kind == "holdings" else [0, 1, 2, 3]  # no "we hold 0x blocks"
    prof = PROFILES[pool[(i + (lab == "false")) % len(pool)]]
    n = prof[lab][kind]
    text = fill(CLAIMS[kind][i], n, prof["round"])
    claim = {"kind": kind, "label": label(kind, n, prof["truth"]), "value": n}
    assert claim["label"] == lab, (kind, i, lab)
    return prof, text, claim


def promise_case(j: int, rnd: int, to: list[str]) -> tuple[str, dict[str, Any]]:
    template, kind, amount, offset, named = PROMISES[j]
    due = None if offset is None else rnd + offset
    text = template.format(n=amount, w=words(amount) if amount is not None else "", d=due, k=offset)
    counterparts = [named] if named else list(to)
    return text, {"amount": amount, "counterparts": counterparts, "due_round": due, "kind": kind}


def build() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(group: str, prof: dict[str, Any], src: int, text: str, claims, promises) -> None:
        source, to = (PROMISE_SOURCES if promises else SOURCES)[src % (3 if promises else 4)]
        if any(p["counterparts"] != list(to) for p in promises):
            to = sorted(set(to) | {c for p in promises for c in p["counterparts"]})
        rows.append(
            {
                "claims": claims,
                "group": group,
                "id": f"t{len(rows):03d}",
                "promises": promises,
                "round": prof["round"],
                "seat": "bidder_0",
                "source": source,
                "text": PREFIXES[len(rows) % len(PREFIXES)] + text,
                "to": list(to),
                "truth": prof["truth"],
            }
        )

    for kind, templates in CLAIMS.items():
        for i in range(len(templates)):
            for lab in ("true", "false"):
                prof, text, claim = claim_case(kind, i, lab)
                add(f"claim:{kind}", prof, len(rows), text, [claim], [])
    for j in range(len(PROMISES)):
        prof = PROFILES[j % len(PROFILES)]
        source, to = PROMISE_SOURCES[j % 3]
        text, promise = promise_case(j, prof["round"], to)
        # the counterparts are the addressees unless the text names a lab
        add(f"promise:{promise['kind']}", prof, j, text, [], [promise])
    for j, (group, text) in enumerate(NEGATIVES):
        add(group, PROFILES[j % len(PROFILES)], j, text, [], [])
    for j, (kind, i, lab, p, prefix) in enumerate(MIXED):
        prof, ctext, claim = claim_case(kind, i, lab)
        promises = []
        text = ctext
        if p is not None:
            _, to = PROMISE_SOURCES[j % 3]
            ptext, promise = promise_case(p, prof["round"], to)
            text = f"{ctext} {ptext}"
            promises = [promise]
        if prefix:
            text = f"{prefix} {ctext}"
        add("mixed", prof, j, text, [claim], promises)
    return rows


# A probe written after the reader's generalisation was frozen (it never changed the reader):
# fresh phrasings of every kind, filled like the set above, written to ``conduct_probe.jsonl``.
PROBE_OUT = Path(__file__).resolve().parent / "conduct_probe.jsonl"
PROBE_CLAIMS: dict[str, list[str]] = {
    "need": [
        "We could use {n} more blocks to get everything done.",
        "Another {n} blocks and our jobs are complete.",
        "Our jobs are still {n} blocks away from done.",
        "Requirement on our end: {n} blocks.",
        "There are {n} blocks left to run on our jobs.",
    ],
    "budget": [
        "We've {n} credits to play with.",
        "{n} credits is all we've got.",
        "Our total spend can't exceed {n} credits.",
        "We have a war chest of {n} credits.",
    ],
    "deadline": [
        "Everything has to be done by the close of round {n}.",
        "Our jobs lapse after round {n}.",
        "Time's up for us at round {n}.",
        "Our clock runs out in round {n}.",
    ],
    "job_size": [
        "One of our jobs is a whopping {n} blocks, the biggest we run.",
        "Our single biggest task eats {n} blocks.",
        "The heaviest thing we run takes {n} blocks.",
        "Biggest job on our books: {n} blocks.",
    ],
    "value": [
        "Our jobs would bring in {n} credits all told.",
        "Our portfolio of jobs is worth about {n}.",
        "In total our jobs are worth {n} credits to us.",
        "The payoff from our jobs totals {n} credits.",
    ],
    "holdings": [
        "We currently own {n} blocks outright.",
        "{n} blocks sit in our account this round.",
        "Right now {n} blocks belong to us.",
        "We're holding onto {n} blocks.",
    ],
}
PROBE_PROMISES: list[tuple[str, str, int | None, int | None, str | None]] = [
    ("Expect delivery of {n} blocks by round {d}.", "deliver", 3, 2, None),
    ("We'll make sure you get {n} blocks by round {d}.", "deliver", 2, 1, None),
    ("Our {n} blocks are yours by round {d}, guaranteed.", "deliver", 4, 2, None),
    ("We'll pay up {n} credits.", "pay", 40, None, None),
    ("{n} credits are coming your way from us.", "pay", 65, None, None),
    ("We'll send over {n} credits by round {d}.", "pay", 30, 1, None),
    ("We'll hold our bids at {n} or less.", "not_bid", 30, None, None),
    ("No bid from us will top {n}.", "not_bid", 45, None, None),
    ("We're in, we'll join.", "join", None, None, None),
    ("We'll be part of your coalition.", "join", None, None, None),
    ("We'll see the coalition through to round {d}.", "stay", None, 3, None),
    ("We'll hang around until round {d}.", "stay", None, 2, None),
    ("We'll throw in a bid.", "bid", None, None, None),
    ("We're bidding this round, for sure.", "bid", None, None, None),
]
PROBE_NEGATIVES: list[tuple[str, str]] = [
    ("none:question", "Could you tell us whether you need 4 blocks?"),
    ("none:conditional", "If the price is right, we'll pay 50."),
    ("none:conditional", "Once you confirm, we will deliver 2 blocks by round 4."),
    ("none:others", "bidder_1 reckons they hold 7 blocks."),
    ("none:others", "Your jobs are worth 900, aren't they."),
    ("none:offer_terms", "Ask: 35 credits per block."),
    ("none:negation", "We are not in need of 10 blocks."),
    ("none:hedge", "We might hold 3 blocks next round."),
    ("none:request", "Please confirm you will pay 40."),
    ("none:past", "We used to need 8 blocks."),
    ("none:public", "The reserve sits at 10."),
]


def build_probe() -> list[dict[str, Any]]:
    """The probe, filled like :func:`build` (a true and a false value per claim template)."""
    saved = (dict(CLAIMS), list(PROMISES), list(NEGATIVES), list(MIXED))
    CLAIMS.clear()
    CLAIMS.update(PROBE_CLAIMS)
    PROMISES[:] = PROBE_PROMISES
    NEGATIVES[:] = PROBE_NEGATIVES
    MIXED[:] = []
    try:
        rows = build()
    finally:
        CLAIMS.clear()
        CLAIMS.update(saved[0])
        PROMISES[:], NEGATIVES[:], MIXED[:] = saved[1], saved[2], saved[3]
    for r in rows:
        r["id"] = "p" + r["id"][1:]
    return rows


def main() -> None:
    for rows, out in ((build(), OUT), (build_probe(), PROBE_OUT)):
        out.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        print(f"wrote {len(rows)} cases to {out}")


if __name__ == "__main__":
    main()
