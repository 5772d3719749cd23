"""The interaction graph of the labs and the cartel detector.

The interaction graph
---------------------
:class:`InteractionGraph` records who deals with whom: an undirected graph with one node per lab
(labs are the integers ``0 .. n-1``) and one edge per pair of labs that ever interacted, kept as
a dict of counters per edge (:attr:`InteractionGraph.graph` gives it as a
:class:`networkx.Graph`). Every edge carries four attributes:

``messages``
    private messages exchanged between the two labs (either direction);
``trades``
    bilateral trades between them;
``coalition_rounds``
    rounds in which both were members of the same declared coalition;
``declared``
    whether they were ever members of the same declared coalition.

Besides the graph it keeps, for the last ``history`` rounds, the private messages of each round and
a compact record of each auction (per lab: unit bids submitted, blocks won, highest bid, whether
active; per round: the reserve price). The ``record_*`` methods update these in place in O(1)
per pair; nothing is rebuilt.

The detector
------------
A *cartel* here is a group of labs that coordinate their bids in secret. Declared coalitions may
bid jointly in the open, so they are not suspects; the detector looks for undeclared coordination.
:func:`detect_cartels` applies the following rule.

1. **Candidate groups.** Keep the edges that carry at least ``min_messages`` private messages
   (counted over the whole game) and whose two labs were never co-members of a declared
   coalition. Each connected component of these edges with at least two labs is a candidate
   group.

2. **Usable rounds.** Take the bid history of the rounds ``r`` with
   ``current_round - window < r <= current_round`` and, for each group, keep only the rounds in
   which at least two of its members were active. Inactive members are ignored throughout. A
   member *won* a round if it won at least one block; it was *suppressed* if it did not win and
   either submitted no bid or bid at most the round's reserve price.

3. **Rotation** is the fraction of usable rounds in which exactly one member won and every other
   active member was suppressed: the members took turns. If the same member was the winner in
   all such rounds, rotation is halved, because a single dominant winner is weaker evidence than
   turn-taking.

4. **Suppression** is the fraction of a member's opportunities to compete against a winning
   partner that it passed up: over the member-rounds (active member, usable round) in which
   *another* member won, the share in which this member was suppressed. (Counting only these
   member-rounds keeps the winner's own row out of the denominator; otherwise a perfect
   two-member rotation could never exceed 1/2.)

5. **Communication** is ``min(1, m / (k * t) / 1.0)``: the private messages ``m`` exchanged
   inside the group (between members that are not declared co-members) during the window, per
   member-round, saturating at one message per member per round. ``k`` is the group size and
   ``t`` the number of rounds in the window, ``min(window, current_round - first_round + 1)``
   where ``first_round`` is the earliest round anything was recorded.

6. **Score** ``= 0.4 * rotation + 0.3 * suppression + 0.3 * communication``, in ``[0, 1]``. With
   fewer than two usable rounds, rotation and suppression are 0.

Consequences worth knowing. Talking alone can never make a group suspected: without a bidding
pattern the score is at most 0.3 < :data:`SUSPECTED`. Honest competitors who all bid above the
reserve every round have rotation = suppression = 0, however much they talk. A group that
talks about one message per member per round and strictly rotates its wins scores 1.0
(:data:`CONFIRMED` is 0.8). The result is deterministic and does not depend on how the labs are
numbered.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, TypedDict, TypeVar

import numpy as np
from numpy.typing import NDArray

from market.core.mechanisms import CoalitionPolicy

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "CONFIRMED",
    "SUSPECTED",
    "CartelSuspicion",
    "InteractionGraph",
    "detect_cartels",
    "flagged_labs",
]

SUSPECTED = 0.5
"""Score from which a group counts as a suspected cartel."""
CONFIRMED = 0.8
"""Score from which a group counts as a confirmed cartel."""

W_ROTATION = 0.4
W_SUPPRESSION = 0.3
W_COMMUNICATION = 0.3
MESSAGES_AT_SATURATION = 1.0
"""Private messages per member per round at which communication reaches 1."""
DEFAULT_HISTORY = 64
"""Rounds of messages and bids an :class:`InteractionGraph` keeps by default."""

_POLICY_THRESHOLD: dict[CoalitionPolicy, float | None] = {
    "allow": None,
    "restrict": None,
    "penalize_suspected": SUSPECTED,
    "penalize_confirmed": CONFIRMED,
}

_Pair = tuple[int, int]
_Kept = TypeVar("_Kept")


class EdgeData(TypedDict):
    """The counters of one pair of labs (an edge of the graph), updated in place."""

    messages: int
    trades: int
    coalition_rounds: int
    declared: bool


_NO_ROUND = sys.maxsize


@dataclass(frozen=True, slots=True)
class _RoundBids:
    """One round of the auction, one entry per lab (labs that joined later are missing)."""

    bid_units: NDArray[np.int32]  # unit bids submitted (0 = abstained)
    won_units: NDArray[np.int32]  # blocks won
    bid_max: NDArray[np.float64]  # highest bid (0 if none)
    active: NDArray[np.bool_]
    reserve: float


class InteractionGraph:
    """Who trades, allies, messages and co-bids with whom: an undirected graph with one node per
    lab, kept as a dict of edge counters (:attr:`graph` gives it as a networkx.Graph).

    ``history`` bounds how many past rounds of messages and bids are kept for the detector (the
    graph's edge counts are never pruned). Rounds are expected to be recorded in increasing
    order; re-recording a round's bids replaces them.
    """

    __slots__ = (
        "_n",
        "_edges",
        "_last_coalition_round",
        "_round_messages",
        "_bids",
        "_history",
        "_first_round",
    )

    def __init__(self, n_labs: int, *, history: int = DEFAULT_HISTORY) -> None:
        n = operator.index(n_labs)
        if n < 0:
            raise ValueError(f"n_labs must be >= 0, got {n}")
        if operator.index(history) < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        self._n = n
        # (low, high) -> that edge's counters, in the order the edges appeared
        self._edges: dict[_Pair, EdgeData] = {}
        self._last_coalition_round: dict[_Pair, int] = {}
        self._round_messages: dict[int, dict[_Pair, int]] = {}
        self._bids: dict[int, _RoundBids] = {}
        self._history = operator.index(history)
        self._first_round = _NO_ROUND

    # ------------------------------------------------------------------ accessors

    @property
    def graph(self) -> nx.Graph:
        """The graph as a :class:`networkx.Graph`: nodes ``0 .. n_labs-1``, each edge with a copy
        of its counters. A snapshot, built on each access; editing it changes nothing here.

        networkx is imported here, on first use: the market itself only counts (a dict per
        edge), and importing networkx was a fifth of every command's start-up."""
        import networkx as nx

        g = nx.Graph()
        g.add_nodes_from(range(self._n))
        g.add_edges_from((a, b, dict(data)) for (a, b), data in self._edges.items())
        return g

    @property
    def n_labs(self) -> int:
        """Number of labs (nodes ``0 .. n_labs-1``)."""
        return self._n

    @property
    def history(self) -> int:
        """How many past rounds of messages and bids are kept."""
        return self._history

    # ------------------------------------------------------------------ recording

    def add_lab(self, lab: int) -> None:
        """Make room for a late entrant. Idempotent; indices stay dense (``0 .. lab`` all exist)."""
        lab = operator.index(lab)
        if lab < 0:
            raise ValueError(f"lab index must be >= 0, got {lab}")
        if lab >= self._n:
            self._n = lab + 1

    def _edge(self, a: int, b: int) -> tuple[tuple[int, int], EdgeData]:
        """The (sorted) key and attribute dict of the edge between two labs, created if new."""
        a, b = int(a), int(b)
        n = self._n
        if a == b or not (0 <= a < n and 0 <= b < n):
            raise ValueError(self._bad_pair(a, b))
        key = (a, b) if a < b else (b, a)
        data = self._edges.get(key)
        if data is None:
            data = self._new_edge(key)
        return key, data

    def record_private_message(self, sender: int, recipient: int, round_: int) -> None:
        """Count one private message from ``sender`` to ``recipient`` in ``round_``."""
        key, data = self._edge(sender, recipient)
        data["messages"] += 1
        r = int(round_)
        per_round = self._round_messages.get(r)
        if per_round is None:
            per_round = self._open_message_round(r)
        per_round[key] = per_round.get(key, 0) + 1

    def record_trade(self, a: int, b: int, round_: int) -> None:
        """Count one bilateral trade between ``a`` and ``b`` in ``round_``."""
        _, data = self._edge(a, b)
        data["trades"] += 1
        r = int(round_)
        if r < self._first_round:
            self._first_round = r

    def record_coalition(self, members: Iterable[int], coalition_id: str, round_: int) -> None:
        """Record that ``members`` form the declared coalition ``coalition_id`` in ``round_``.

        Every pair of members gets ``declared = True``; its ``coalition_rounds`` grows by one per
        distinct round, so recording the same coalition (or two coalitions sharing the pair) twice
        in one round counts once. ``coalition_id`` identifies the coalition for the caller's
        records; the detector only needs the pairs.
        """
        ids = sorted({int(m) for m in members})
        n = self._n
        for m in ids:
            if not 0 <= m < n:
                raise ValueError(f"coalition {coalition_id!r}: lab {m} out of range 0..{n - 1}")
        r = int(round_)
        if r < self._first_round:
            self._first_round = r
        edges = self._edges
        last = self._last_coalition_round
        for i, a in enumerate(ids):
            for b in ids[i + 1 :]:
                key = (a, b)
                data = edges.get(key)
                if data is None:
                    data = self._new_edge(key)
                data["declared"] = True
                if last.get(key) != r:
                    last[key] = r
                    data["coalition_rounds"] += 1

    def record_round_bids(
        self,
        round_: int,
        bid_units: Sequence[int],
        won_units: Sequence[int],
        bid_max: Sequence[float],
        reserve: float,
        active: Sequence[bool],
    ) -> None:
        """Store one round of the auction; each sequence has one entry per lab (``n_labs``).

        ``bid_units``: unit bids the lab submitted (0 = abstained); ``won_units``: blocks it won;
        ``bid_max``: its highest bid (0 if none); ``reserve``: the round's reserve price;
        ``active``: whether the lab takes part in the market this round. The arrays are copied.
        """
        n = self._n
        units = np.array(bid_units, dtype=np.int32)
        won = np.array(won_units, dtype=np.int32)
        top = np.array(bid_max, dtype=np.float64)
        act = np.array(active, dtype=bool)
        if not units.shape == won.shape == top.shape == act.shape == (n,):
            raise ValueError(
                f"round {round_}: bid_units, won_units, bid_max and active must each have "
                f"n_labs={n} entries, got {units.shape}, {won.shape}, {top.shape}, {act.shape}"
            )
        r = int(round_)
        if r not in self._bids:
            self._prune(self._bids, r)
        self._bids[r] = _RoundBids(units, won, top, act, float(reserve))
        if r < self._first_round:
            self._first_round = r

    # ------------------------------------------------------------------ internals

    def _new_edge(self, key: _Pair) -> EdgeData:
        data: EdgeData = {"messages": 0, "trades": 0, "coalition_rounds": 0, "declared": False}
        self._edges[key] = data
        return data

    def _open_message_round(self, r: int) -> dict[_Pair, int]:
        self._prune(self._round_messages, r)
        per_round: dict[_Pair, int] = {}
        self._round_messages[r] = per_round
        if r < self._first_round:
            self._first_round = r
        return per_round

    def _prune(self, per_round: dict[int, _Kept], newest: int) -> None:
        """Drop rounds that fell out of the kept history once ``newest`` is recorded."""
        if len(per_round) >= self._history:
            cutoff = newest - self._history
            for r in [r for r in per_round if r <= cutoff]:
                del per_round[r]

    def _bad_pair(self, a: int, b: int) -> str:
        if a == b:
            return f"lab {a} cannot interact with itself"
        return f"labs ({a}, {b}) out of range 0..{self._n - 1}; call add_lab for late entrants"

    def _candidate_groups(self, min_messages: int) -> list[list[int]]:
        """Connected components (size >= 2) of the undeclared edges with enough messages.

        Union-find with path halving over a list; each root is its component's smallest lab.
        """
        n = self._n
        parent = list(range(n))
        linked = [False] * n
        for (a, b), data in self._edges.items():
            if data["messages"] < min_messages or data["declared"]:
                continue
            linked[a] = linked[b] = True
            while parent[a] != a:
                parent[a] = a = parent[parent[a]]
            while parent[b] != b:
                parent[b] = b = parent[parent[b]]
            if a < b:
                parent[b] = a
            elif b < a:
                parent[a] = b
        components: dict[int, list[int]] = {}
        for lab in range(n):
            if linked[lab]:
                root = lab
                while parent[root] != root:
                    root = parent[root]
                components.setdefault(root, []).append(lab)
        return list(components.values())

    def _window_matrices(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(active, won, suppressed) boolean matrices, rounds in ``(lo, hi]`` by lab."""
        rounds = sorted(r for r in self._bids if lo < r <= hi)
        shape = (len(rounds), self._n)
        act = np.zeros(shape, dtype=bool)
        won = np.zeros(shape, dtype=bool)
        sup = np.zeros(shape, dtype=bool)
        for i, r in enumerate(rounds):
            rb = self._bids[r]
            width = rb.active.shape[0]
            a = rb.active
            w = a & (rb.won_units > 0)
            act[i, :width] = a
            won[i, :width] = w
            sup[i, :width] = a & ~w & ((rb.bid_units <= 0) | (rb.bid_max <= rb.reserve))
        return act, won, sup

    def _window_messages(
        self, lo: int, hi: int, group_of: dict[int, int], n_groups: int
    ) -> list[int]:
        """Private messages in rounds ``(lo, hi]`` inside each group, declared pairs excluded."""
        counts = [0] * n_groups
        edges = self._edges
        for r, per_round in self._round_messages.items():
            if not lo < r <= hi:
                continue
            for key, c in per_round.items():
                ga = group_of.get(key[0])
                if ga is not None and ga == group_of.get(key[1]) and not edges[key]["declared"]:
                    counts[ga] += c
        return counts


@dataclass(frozen=True)
class CartelSuspicion:
    """A candidate cartel, its score in [0, 1] and the named parts of the score."""

    members: frozenset[int]
    score: float
    evidence: dict[str, float]


def detect_cartels(
    g: InteractionGraph, current_round: int, window: int = 4, min_messages: int = 2
) -> list[CartelSuspicion]:
    """Score every candidate group by the rule in the module docstring, highest score first.

    Every candidate group is returned, whatever its score (use :func:`flagged_labs` to pick the
    ones a policy punishes). Ties are broken by the sorted member list.
    """
    window = operator.index(window)
    min_messages = operator.index(min_messages)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if min_messages < 1:
        raise ValueError(f"min_messages must be >= 1, got {min_messages}")
    groups = g._candidate_groups(min_messages)
    if not groups:
        return []
    hi = int(current_round)
    lo = hi - window

    n_groups = len(groups)
    sizes = np.fromiter((len(m) for m in groups), dtype=np.intp, count=n_groups)
    starts = np.zeros(n_groups, dtype=np.intp)
    np.cumsum(sizes[:-1], out=starts[1:])
    cols = np.fromiter(chain.from_iterable(groups), dtype=np.intp, count=int(sizes.sum()))

    rotation = np.zeros(n_groups)
    suppression = np.zeros(n_groups)
    act_all, won_all, sup_all = g._window_matrices(lo, hi)
    if act_all.shape[0] >= 2:
        act = act_all[:, cols]  # rounds x (members of all groups, group after group)
        won = won_all[:, cols]
        sup = sup_all[:, cols]
        n_act = np.add.reduceat(act.astype(np.int64), starts, axis=1)  # rounds x groups
        n_won = np.add.reduceat(won.astype(np.int64), starts, axis=1)
        n_sup = np.add.reduceat(sup.astype(np.int64), starts, axis=1)
        usable = n_act >= 2
        n_usable = usable.sum(axis=0)

        took_turns = usable & (n_won == 1) & (n_sup == n_act - 1)
        # With exactly one winner, the sum of (lab + 1) over winners names it.
        winner = np.add.reduceat(won * (cols + 1), starts, axis=1)
        first = np.where(took_turns, winner, np.iinfo(np.int64).max).min(axis=0)
        last = np.where(took_turns, winner, -1).max(axis=0)
        rotation = took_turns.sum(axis=0) / np.maximum(n_usable, 1)
        rotation = np.where(last > first, rotation, rotation / 2)

        others_won = np.repeat(n_won, sizes, axis=1) - won  # rounds x members
        chances = act & np.repeat(usable, sizes, axis=1) & (others_won >= 1)
        n_chances = np.add.reduceat(chances.sum(axis=0), starts)
        n_passed = np.add.reduceat((chances & sup).sum(axis=0), starts)
        suppression = n_passed / np.maximum(n_chances, 1)

        enough = n_usable >= 2
        rotation = np.where(enough, rotation, 0.0)
        suppression = np.where(enough, suppression, 0.0)

    group_of = {lab: gi for gi, members in enumerate(groups) for lab in members}
    messages = g._window_messages(lo, hi, group_of, n_groups)
    first_round = min(g._first_round, hi)
    n_rounds = max(1, min(window, hi - first_round + 1))

    out: list[CartelSuspicion] = []
    for gi, members in enumerate(groups):
        rot = float(rotation[gi])
        supp = float(suppression[gi])
        per_member_round = messages[gi] / (len(members) * n_rounds)
        comm = min(1.0, per_member_round / MESSAGES_AT_SATURATION)
        score = W_ROTATION * rot + W_SUPPRESSION * supp + W_COMMUNICATION * comm
        out.append(
            CartelSuspicion(
                members=frozenset(members),
                score=min(1.0, max(0.0, score)),
                evidence={"rotation": rot, "suppression": supp, "communication": comm},
            )
        )
    out.sort(key=lambda s: (-s.score, sorted(s.members)))
    return out


def flagged_labs(suspicions: list[CartelSuspicion], policy: CoalitionPolicy) -> set[int]:
    """Labs a coalition policy punishes: members of groups at or above its threshold.

    ``penalize_suspected`` uses :data:`SUSPECTED`, ``penalize_confirmed`` uses :data:`CONFIRMED`;
    ``allow`` and ``restrict`` punish nobody.
    """
    if policy not in _POLICY_THRESHOLD:
        valid = ", ".join(sorted(_POLICY_THRESHOLD))
        raise ValueError(f"unknown coalition policy {policy!r}; valid policies: {valid}")
    threshold = _POLICY_THRESHOLD[policy]
    if threshold is None:
        return set()
    return {lab for s in suspicions if s.score >= threshold for lab in s.members}
