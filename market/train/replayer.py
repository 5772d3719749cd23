"""Transcripts as training-data input: reading and verifying them, and :class:`Replayer`, a fresh
env stepped through a transcript's recorded actions (used by the SFT export,
:mod:`market.train.training_data`, and the GRPO reward, :mod:`market.train.grpo`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from market.record.transcript import (
    StepEvent,
    Transcript,
    TranscriptError,
    decode_action,
    read_transcript,
)
from market.review.replay import obs_digest, rebuild_env
from market.review.replay import transcript_files as replay_files


def transcript_files(sources: Iterable[str | Path]) -> list[Path]:
    """Transcript files from files, folders of ``*.jsonl`` and run folders (as ``replay``).
    Raises :class:`TranscriptError` for a missing path or a folder without transcripts."""
    files: list[Path] = []
    for src in sources:
        path = Path(src)
        if not path.exists():
            raise TranscriptError(f"{path}: no such file or folder")
        found = replay_files([path])
        if not found:
            raise TranscriptError(f"{path}: no *.jsonl transcripts in this folder")
        files += found
    return files


def load_transcript(path: str | Path, partial: bool = False) -> Transcript:
    """Read and verify a transcript; a cut or aborted file is an error unless ``partial``."""
    t = read_transcript(path)
    if not t.complete and not partial:
        raise TranscriptError(
            f"{path}: {t.incomplete}; pass --partial to export the complete steps"
        )
    return t


class Replayer:
    """A fresh env stepped through a transcript's recorded actions, by :mod:`market.review.replay`'s
    rules (the header's resolved scenario, the recorded seed, an LLM judge's recorded verdicts),
    checking the seat, round, phase, observation digest and state digest of every step."""

    def __init__(self, t: Transcript, env: Any = None, next_step: int = 0) -> None:
        self.t = t
        self.name = str(t.path or "transcript")
        self.next = next_step  # index of the next recorded step to play
        # continue from a restored env that is at step ``next_step``, or start afresh
        self.env = env if env is not None else rebuild_env(t)[0]

    def _diverged(self, ev: StepEvent, what: str, recorded: Any, live: Any) -> TranscriptError:
        return TranscriptError(
            f"{self.name}: step {ev.i} ({ev.seat}): the replay diverges from the recording "
            f"({what}: recorded {recorded!r}, replay {live!r}); check it with 'gpumarket replay'"
        )

    def observe(self) -> tuple[StepEvent, Any, bool]:
        """(the next recorded step, the observation its seat acts on, whether the seat is live)."""
        ev, env = self.t.steps[self.next], self.env
        if not env.agents:
            raise self._diverged(ev, "seat", ev.seat, "<episode over>")
        for name, live_value in (
            ("seat", env.agent_selection),
            ("round", env.round),
            ("phase", env.phase),
        ):
            if getattr(ev, name) != live_value:
                raise self._diverged(ev, name, getattr(ev, name), live_value)
        obs, _, terminated, truncated, _ = env.last()
        live = not (terminated or truncated)
        if live and ev.obs_digest is not None and obs_digest(obs) != ev.obs_digest:
            raise self._diverged(ev, "obs_digest", ev.obs_digest, obs_digest(obs))
        return ev, obs, live

    def advance(self, agents: Mapping[str, Any] | None = None) -> None:
        """Play the next recorded step. ``agents`` (seat -> agent) are shown their seat's
        observation first (their choice is discarded), so stateful agents remember the episode."""
        ev, obs, live = self.observe()
        agent = (agents or {}).get(ev.seat)
        if live and agent is not None:
            with contextlib.suppress(Exception):  # a stand-in's bug must not stop the replay
                agent.act(obs)
        self.env.step(decode_action(ev.action_kind, ev.action))
        if ev.state_digest is not None and self.env.state_digest() != ev.state_digest:
            raise self._diverged(ev, "state_digest", ev.state_digest, self.env.state_digest())
        self.next += 1
