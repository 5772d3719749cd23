"""Seeded random streams.

One ``SeedSequence`` per episode spawns an independent ``numpy.random.Generator`` per purpose and
round, so an agent's actions never change which shocks, jobs or failures occur (common random
numbers): the world and shock streams are consumed entirely at reset, and the per-round streams
are keyed by round, not by how many draws happened before. No global RNG state is touched.
"""

from __future__ import annotations

import numpy as np

# ids are part of the episode's definition (golden transcripts depend on them): never renumber
_STREAM_IDS = {"world": 0, "shocks": 1, "clearing": 3, "seat": 5, "failures": 7}


class RngStreams:
    def __init__(self, seed: int | None) -> None:
        self.entropy = np.random.SeedSequence(seed).entropy

    def stream(self, name: str, *keys: int) -> np.random.Generator:
        """The generator for ``name``: world, shocks (drawn at reset), clearing (per round: tie-breaks, then execution failures; posted-price lotteries use key 1), failures (per round and lab: owned blocks that fail, see market.core.delivery) or seat."""
        seq = np.random.SeedSequence(self.entropy, spawn_key=(_STREAM_IDS[name], *keys))
        return np.random.Generator(np.random.PCG64(seq))

    def seat_seed(self, seat_index: int) -> int:
        """A seed for a seat's own agent; it reveals nothing about the episode seed."""
        seq = np.random.SeedSequence(self.entropy, spawn_key=(_STREAM_IDS["seat"], seat_index))
        return int(seq.generate_state(1, dtype=np.uint32)[0])
