"""A remote seat's guide: what its turn's view tells a person (the browser seat) in plain words.

The words come from :mod:`market.environment.seat_guide`, the terminal seat's own code, so the
browser and the terminal say the same thing. On each of a remote seat's turns its view carries
``guide`` (JSON):

- ``last_action``: the env's verdict on the seat's previous action (the observation's
  ``last_action``): ``action_type``, ``accepted``, and when refused the env's ``error`` word for
  word and the ``penalty`` it cost; ``text`` is the verdict as one sentence. Null before the
  seat's first action;
- ``story``: plain sentences of what happened since the seat's previous turn, as far as it may
  see (offers to it, messages, trades, the auction's result), ending with its rewards by
  component since then;
- ``valid``: the action types valid now (the action mask's rule), each with its one-line
  ``meaning``, the ``fields`` it needs (``name``, the plain ``prompt``, ``required``, ``kind``,
  the ``choices`` valid now as ``{value, label}``, a ``default`` as typed) and the ``extra``
  optional fields not asked by default;
- ``screen``: the seat's state as plain lines.

Once the match is over the view's ``guide`` holds ``last_action`` and ``story`` only: the verdict
on the seat's last action and its rewards since (the episode's end pays for finished jobs).

Rules: everything comes from the seat's own observations, its previous one kept here, and its
rewards from the match's own transcript: the step records written since the seat's previous turn
began (its own action's step and every one after), read once each, off the event loop. Text that
other seats wrote is passed on as text; the page shows it with ``textContent`` only.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from market.environment import LastActionView, Observation
from market.environment.seat_guide import ActionChoice, describe, story, valid_actions
from market.environment.seat_story import reward_words, verdict


class SeatGuide:
    """One remote seat's guide across its turns: its previous observation and where in the
    transcript its previous turn began."""

    def __init__(self, seat: str, transcript: Path | None) -> None:
        self.seat = seat
        self.transcript = transcript
        self.previous: Observation | None = None
        self.mark = 0  # the transcript's size when the seat's previous turn began
        self._final: dict[str, Any] | None = None

    def view(self, obs: Observation) -> dict[str, Any]:
        """The ``guide`` of the turn whose observation is ``obs`` (call once per turn, in order)."""
        mark = self._size()
        rewards, _ = self.steps_since(self.mark, mark)
        guide = {
            "last_action": verdict_json(obs.last_action),
            "story": story(self.previous, obs, rewards),
            "valid": [choice_json(c) for c in valid_actions(obs)],
            "screen": describe(obs),
        }
        self.previous, self.mark = obs, mark
        return guide

    def final(self) -> dict[str, Any]:
        """The ``guide`` of the seat's view once the match is over: the verdict on its last
        action and its rewards since (the episode's end pays the jobs), from the transcript;
        built once."""
        if self._final is None:
            rewards, last = self.steps_since(self.mark, self._size())
            unit = self.previous.value_unit if self.previous is not None else 100.0
            lines = [verdict(last)] if last is not None else []
            self._final = {
                "last_action": verdict_json(last),
                "story": lines + reward_words(rewards or {}, unit),
            }
        return self._final

    def _size(self) -> int:
        try:
            return 0 if self.transcript is None else os.path.getsize(self.transcript)
        except OSError:
            return 0

    def steps_since(
        self, start: int, end: int
    ) -> tuple[dict[str, float] | None, LastActionView | None]:
        """The seat's rewards by component in the transcript's step records between byte
        offsets ``start`` and ``end`` (None without a transcript), and the verdict on its first
        action among them (its last action, when ``start`` is where its last turn began)."""
        if self.transcript is None:
            return None, None
        if end <= start:
            return {}, None
        with open(self.transcript, "rb") as fh:
            fh.seek(start)
            chunk = fh.read(end - start)
        key = json.dumps(self.seat).encode()
        total: dict[str, float] = defaultdict(float)
        last: LastActionView | None = None
        for line in chunk.splitlines():
            if key not in line:  # a step that neither is this seat's nor pays it: unparsed
                continue
            record = json.loads(line)
            if record.get("type") != "step":
                continue
            paid = (record.get("components") or {}).get(self.seat, {})
            for component, value in paid.items():
                total[component] += float(value)
            if last is None and record.get("seat") == self.seat and record.get("live"):
                last = step_verdict(record, paid)
        return {k: v for k, v in total.items() if v != 0.0}, last


def step_verdict(record: dict[str, Any], paid: dict[str, Any]) -> LastActionView:
    """The verdict a step record holds, as the observation's ``last_action`` would say it."""
    info = record.get("info") or {}
    error = info.get("error")
    sent = record.get("action")
    action = info.get("action") or (sent.get("action_type") if isinstance(sent, dict) else None)
    result = info.get("result")
    return LastActionView(
        round=int(record.get("round", 0)),
        phase=str(record.get("phase", "")),
        action_type=None if action is None else str(action),
        accepted=error is None,
        error=None if error is None else str(error),
        penalty=-float(paid.get("invalid_action", 0.0)) if error is not None else 0.0,
        result=result if isinstance(result, dict) else None,
    )


def verdict_json(last: LastActionView | None) -> dict[str, Any] | None:
    """The verdict as the page reads it: the fields, and ``text``, the sentence the terminal
    seat shows (:func:`~market.environment.seat_story.verdict`)."""
    return None if last is None else {**last.model_dump(mode="json"), "text": verdict(last)}


def choice_json(choice: ActionChoice) -> dict[str, Any]:
    """An :class:`ActionChoice` as the page reads it."""
    return {
        "action_type": choice.action_type,
        "meaning": choice.meaning,
        "fields": [
            {
                "name": f.name,
                "prompt": f.prompt,
                "required": f.required,
                "kind": f.kind,
                "choices": [{"value": c.value, "label": c.label} for c in f.choices],
                "default": f.default,
            }
            for f in choice.fields
        ],
        "extra": list(choice.extra),
    }
