"""An LLM seat's memory within an episode: ``memory=none|window:N|full|summary[:N]``.

The rules:

- ``none``: every decision is a fresh system + user message (the observation in full).
- Otherwise the seat's conversation persists across its decisions: the system message once, at
  the top (it states the current phase's rules), then one *turn* per earlier decision: the user
  message sent, the model's reply as it sent it (its text without ``<think>`` blocks, or in tool
  mode the assistant tool-call message and a ``tool`` message with the result), then the current
  turn. A turn after the first does not repeat the observation: it opens with the result of the
  seat's previous action and what changed since its last turn (:func:`observation_diff`), then
  the phase's legal actions. Other seats' free text in a diff (messages, pitches, offer notes,
  coalition purposes) is quoted with :func:`market.core.trust.quote_untrusted` (re-exported by ``market.environment``).
- ``window:N`` keeps the last ``N`` earlier turns, ``full`` all of them, ``summary:N`` the last
  ``N`` (default 6) verbatim and one digest line per older turn (deterministic: round, phase,
  the action played and what followed), prefixed to the first user message.
- Whenever no kept turn shows the whole observation (the first turn was dropped), the current turn
  shows it again instead of a diff, so the model always has the full state in view.
- **Budget**: the prompt (messages and tool definitions) never exceeds ``context - max_tokens``
  tokens. Over budget, the oldest turns are dropped first (into the digest in ``summary`` mode,
  whose oldest lines go next); the system message and the current turn are never dropped. Tokens
  are counted by :class:`TokenCounter`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agents.llm.prompts import action_formats
from agents.llm.tools import backend_hook
from market.environment import Observation, quote_untrusted

#: the default memory: the last 6 earlier decisions verbatim
DEFAULT_MEMORY = "window:6"
#: the default context size in tokens when ``context`` is not given
DEFAULT_CONTEXT = 8192
#: the character budget's rule: one token per this many characters (JSON-heavy text runs about
#: 3.5 characters a token in common tokenizers, so 3 over-counts: prompts stay under budget)
CHARS_PER_TOKEN = 3
MESSAGE_OVERHEAD = 4  # tokens a chat template adds around each message
MAX_DIGEST_CHARS = 240
Message = dict[str, Any]


def parse_memory(value: str) -> tuple[str, int | None]:
    """``(kind, turns kept verbatim)`` of a ``memory=`` value (turns None: all)."""
    text = str(value).strip().lower()
    kind, _, arg = text.partition(":")
    if kind in ("none", "full") and not arg:
        return kind, None
    if kind in ("window", "summary"):
        if not arg and kind == "summary":
            return kind, 6
        try:
            n = int(arg)
        except ValueError:
            n = -1
        if n >= 0:
            return kind, n
    raise ValueError(
        f"memory must be none, full, window:N or summary[:N] (N >= 0 earlier turns kept), "
        f"got {value!r}"
    )


class TokenCounter:
    """Counts prompt tokens: the backend's own tokenizer (its optional ``count_tokens(text)``
    hook), else ``tiktoken`` for OpenAI model names when its encoding files are available
    offline, else ``ceil(chars / 3)``. ``kind``: ``auto`` (that order), ``model``, ``tiktoken`` or
    ``chars`` (``tiktoken`` pinned counts other model names with ``o200k_base``); ``name`` says
    which counter is in use. A counter pinned by name that is not available, or one that fails,
    falls back to characters for the rest of the run and says so in ``failure`` (the agent
    records that as a degraded feature; ``auto`` falling back to characters is not)."""

    def __init__(self, backend: Any = None, model: str = "", kind: str = "auto") -> None:
        if kind not in ("auto", "model", "tiktoken", "chars"):
            raise ValueError(f"counter must be auto, model, tiktoken or chars, got {kind!r}")
        self.kind = kind
        self.backend, self.model = backend, model
        self._count: Any = None
        self.name = ""
        self.failure: str | None = None
        self._memo: dict[str, int] = {}

    def _resolve(self) -> None:
        hook = backend_hook(self.backend, "count_tokens")
        if self.kind in ("auto", "model") and callable(hook):
            try:
                hook("probe")
                self._count, self.name = hook, "model"
                return
            except Exception as exc:
                # a backend without a tokenizer endpoint (NotImplementedError) under auto is the
                # documented fallback; anything else, or a pinned counter, is a degraded feature
                if self.kind == "model" or not isinstance(exc, NotImplementedError):
                    self.failure = f"count_tokens failed ({type(exc).__name__}: {exc})"[:200]
        openai_name = self.model.startswith(("gpt-", "gpt4", "o1", "o3", "o4", "chatgpt"))
        if self.kind == "tiktoken" or (self.kind == "auto" and openai_name):
            try:
                import tiktoken  # optional: its encodings are downloaded, often not available

                encoding = (
                    tiktoken.encoding_for_model(self.model)
                    if openai_name
                    else tiktoken.get_encoding("o200k_base")
                )
                self._count = lambda text: len(encoding.encode(text, disallowed_special=()))
                self.name = f"tiktoken:{encoding.name}"
                return
            except Exception as exc:
                if self.kind == "tiktoken":
                    self.failure = f"tiktoken unavailable ({type(exc).__name__})"
        if self.kind == "model" and self.failure is None:
            self.failure = "count_tokens: the backend has no such hook"
        self._count, self.name = self.chars, f"chars/{CHARS_PER_TOKEN}"

    @staticmethod
    def chars(text: str) -> int:
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def count(self, text: str) -> int:
        if self._count is None:
            self._resolve()
        if text in self._memo:
            return self._memo[text]
        try:
            n = int(self._count(text))
        except Exception as exc:
            self.failure = f"{self.name} failed ({type(exc).__name__}: {exc})"[:200]
            self._count, self.name = self.chars, f"chars/{CHARS_PER_TOKEN}"
            self._memo.clear()
            n = self.chars(text)
        if len(self._memo) > 4096:
            self._memo.clear()
        self._memo[text] = n
        return n

    def messages(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> int:
        """Tokens of a request: every message's content and tool calls plus a per-message
        overhead, and the tool definitions."""
        total = 0
        for m in messages:
            total += MESSAGE_OVERHEAD + self.count(str(m.get("content") or ""))
            if m.get("tool_calls"):
                total += self.count(json.dumps(m["tool_calls"], separators=(",", ":")))
        if tools:
            total += self.count(json.dumps(tools, separators=(",", ":")))
        return total


# ---------------------------------------------------------------------------------------------
# what changed between two observations


def _dump(value: Any, drop: tuple[str, ...] = ()) -> str:
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in drop}
    return json.dumps(value, separators=(",", ":"))


def _by_id(items: list[Any] | None, key: str) -> dict[str, Any]:
    return {getattr(v, key): v for v in items or []}


def _list_changes(
    label: str, old: list[Any] | None, new: list[Any] | None, key: str, text_field: str | None
) -> tuple[list[str], list[str]]:
    """Lines for items new or changed in ``new`` by id, and quoted blocks of new free text."""
    lines: list[str] = []
    quotes: list[str] = []
    before = _by_id(old, key)
    for item_id, item in _by_id(new, key).items():
        drop = (text_field,) if text_field else ()
        if item_id not in before:
            lines.append(f"new {label}: {_dump(item, drop)}")
            text = getattr(item, text_field, None) if text_field else None
            if text:
                sender = getattr(item, "sender", None) or getattr(item, "leader", "?")
                quotes.append(quote_untrusted(str(sender), f"{label} note {item_id}", text))
        elif _dump(item) != _dump(before[item_id]):
            lines.append(f"{label} {item_id} now: {_dump(item, drop)}")
    return lines, quotes


def observation_diff(prev: Observation, obs: Observation) -> tuple[list[str], list[str]]:
    """What changed from ``prev`` to ``obs`` (the same seat's observations): compact lines, and
    the other seats' new free text as quoted untrusted blocks."""
    lines: list[str] = []
    quotes: list[str] = []
    if obs.mechanism != prev.mechanism:
        lines.append(f"mechanism in force: {_dump(obs.mechanism)}")
    if (obs.capacity, obs.reliability, obs.energy_floor) != (
        prev.capacity,
        prev.reliability,
        prev.energy_floor,
    ):
        lines.append(
            f"this round: {obs.capacity} blocks, reliability {obs.reliability:.2f}, "
            f"floor price {obs.energy_floor:g}"
        )
    if obs.active_labs != prev.active_labs:
        lines.append(f"active labs: {', '.join(obs.active_labs)}")
    moved = {k: v for k, v in obs.reputations.items() if prev.reputations.get(k) != v}
    if moved:
        lines.append(f"reputations changed: {_dump(moved)}")
    if obs.budget is not None and obs.budget != prev.budget:
        lines.append(f"your budget: {prev.budget or 0:.2f} -> {obs.budget:.2f}")
    if obs.reputation is not None and obs.reputation != prev.reputation:
        lines.append(f"your reputation: {prev.reputation or 0:.3f} -> {obs.reputation:.3f}")
    if obs.holdings != prev.holdings or obs.round != prev.round:
        lines.append(f"blocks you own for rounds {obs.round}, {obs.round + 1}, ...: {obs.holdings}")
    for label, old, new, key, text in (
        ("job", prev.jobs, obs.jobs, "job_id", None),
        ("offer to you", prev.offers_received, obs.offers_received, "offer_id", "message"),
        ("offer of yours", prev.offers_sent, obs.offers_sent, "offer_id", None),
        ("contract", prev.contracts, obs.contracts, "contract_id", None),
        ("coalition of yours", prev.coalitions, obs.coalitions, "coalition_id", "purpose"),
        (
            "declared coalition",
            prev.public_coalitions,
            obs.public_coalitions,
            "coalition_id",
            "purpose",
        ),
    ):
        more, said = _list_changes(label, old, new, key, text)
        lines += more
        quotes += said
    if obs.last_result is not None and obs.last_result != prev.last_result:
        lines.append(f"clearing result: {_dump(obs.last_result)}")
    if obs.designer_stats is not None and obs.designer_stats != prev.designer_stats:
        latest = {
            k: (v[-1] if v else None) if isinstance(v, list) else v
            for k, v in obs.designer_stats.model_dump().items()
        }
        lines.append(f"market health (latest): {_dump(latest)}")
    new_shocks = [s for s in obs.shocks if s not in prev.shocks]
    if new_shocks:
        lines.append(f"new shocks: {_dump([s.model_dump(exclude_none=True) for s in new_shocks])}")
    seen = Counter(_dump(m) for m in prev.messages)
    for m in obs.messages:
        k = _dump(m)
        if seen[k]:
            seen[k] -= 1
            continue
        to = m.to if isinstance(m.to, str) else ", ".join(m.to)
        lines.append(f"message from {m.sender} to {to} (round {m.round})")
        quotes.append(quote_untrusted(m.sender, "message", m.text))
    old_pitches = Counter(_dump(p) for p in prev.pitches)
    for p in obs.pitches:
        k = _dump(p)
        if old_pitches[k]:
            old_pitches[k] -= 1
            continue
        lines.append(f"pitch by {p.lab} asking {p.blocks_requested} blocks")
        quotes.append(quote_untrusted(p.lab, "pitch", p.text))
        quotes += [quote_untrusted(p.lab, "pitch counter", c) for c in p.counters]
    return lines, quotes


# ---------------------------------------------------------------------------------------------
# the conversation


@dataclass
class Turn:
    """One earlier decision in the conversation."""

    round: int
    phase: str
    messages: list[Message]
    full: bool  # its user message shows the whole observation
    action: dict[str, Any] | None
    fallback: bool
    call_id: str | None = None
    digest: str = ""
    closed: bool = False  # its result is attached
    extra: dict[str, Any] = field(default_factory=dict)


def _short_action(action: dict[str, Any] | None) -> str:
    if action is None:
        return "nothing"
    return json.dumps({k: v for k, v in action.items() if k != "reasoning"}, separators=(",", ":"))


def schema_text(obs: Observation) -> str:
    """The legal actions' reply format as the first-turn prompt shows it (``user.j2``)."""
    head = (
        f'Legal now ({obs.phase} phase): reply {{"action_type": TYPE, ...its fields}} for one TYPE '
        'below ("?": optional field).'
    )
    return "\n".join([head, *action_formats(obs.legal_actions, obs.role == "designer")])


def turn_tail(obs: Observation, tools: bool = False, short: bool = False) -> str:
    """How a later turn ends: the legal action types and the reply format (the JSON schema of
    the legal actions; ``short``: a pointer to the schema shown earlier; in tool mode a call of
    one of the functions)."""
    legal = f"Legal action types now: {', '.join(obs.legal_actions)}."
    if tools:
        return f"{legal} Act by calling one of the functions offered."
    if short:
        return f"{legal}\nReply with one JSON object matching the JSON schema shown earlier."
    return schema_text(obs)


def _usable(history: list[Turn], needs_anchor: bool, needs_text: str | None) -> bool:
    """Whether the kept turns allow a current turn: one showing the whole observation (an
    anchor) when it is a diff, and one showing ``needs_text`` (the schema) when it leaves it out."""
    if needs_anchor and not any(t.full for t in history):
        return False
    return needs_text is None or any(
        needs_text in str(m.get("content") or "") for t in history for m in t.messages
    )


class Memory:
    """A seat's conversation in one episode (see the module docstring for the rules)."""

    def __init__(
        self,
        mode: str = DEFAULT_MEMORY,
        context: int | None = DEFAULT_CONTEXT,
        counter: TokenCounter | None = None,
    ) -> None:
        self.mode = str(mode).strip().lower()
        self.kind, self.keep = parse_memory(self.mode)
        if context is not None and context < 1:
            raise ValueError(f"context must be a positive number of tokens, got {context}")
        self.context = context
        self.counter = counter or TokenCounter()
        self.reset()

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def reset(self) -> None:
        self.turns: list[Turn] = []
        self.last_obs: Observation | None = None
        self.note = ""  # said in the next turn: a decision that got no reply

    def budget(self, reply_tokens: int | None) -> int | None:
        """Prompt tokens allowed: the context less the reply's ``max_tokens``."""
        if self.context is None:
            return None
        return max(1, self.context - int(reply_tokens or 0))

    def _close_previous(self, obs: Observation) -> str:
        """Attach the result of the previous turn's action (a ``tool`` message in tool mode);
        returns the text the current user message opens with (empty in tool mode)."""
        prev = self.turns[-1] if self.turns else None
        if prev is None or prev.closed or self.last_obs is None:
            return ""
        lines, quotes = observation_diff(self.last_obs, obs)
        # the env's verdict on it (Observation.last_action): a refused action changed nothing
        verdict = obs.last_action
        refused = (
            verdict is not None
            and not verdict.accepted
            and (verdict.round, verdict.phase) == (prev.round, prev.phase)
        )
        what = "was replaced by the fallback" if prev.fallback else "was played"
        head = f"Your action in round {prev.round} ({prev.phase}) {what}: {_short_action(prev.action)}."
        if refused and verdict is not None:
            head = (
                f"Your action in round {prev.round} ({prev.phase}), "
                f"{_short_action(prev.action)}, was refused by the market: {verdict.error}; "
                f"it changed nothing and cost {verdict.penalty:g}."
            )
        changes = "\n".join(f"- {line}" for line in lines) or "- nothing else changed"
        result = "\n".join([head, "What changed since your last turn:", changes, *quotes])
        prev.digest = (
            f"round {prev.round} {prev.phase}: you played {_short_action(prev.action)}"
            + (" (fallback)" if prev.fallback else "")
            + (f" (refused: {verdict.error})" if refused and verdict is not None else "")
            + (f"; then {'; '.join(lines[:3])}" if lines else "")
        )[:MAX_DIGEST_CHARS]
        prev.closed = True
        if prev.call_id is not None:
            prev.messages.append({"role": "tool", "tool_call_id": prev.call_id, "content": result})
            return ""
        return result

    def begin(
        self,
        obs: Observation,
        system: str,
        full_user: str,
        tools: list[dict[str, Any]] | None = None,
        reply_tokens: int | None = None,
    ) -> None:
        """Start a decision: attach the previous action's result and fix what this turn may say.

        ``full_user``: the user message with the whole observation. A later turn ends with the
        phase's legal actions and the reply format (:func:`turn_tail`), or a pointer to the schema
        when a kept turn shows it."""
        opening = self._close_previous(obs)
        note, self.note = self.note, ""
        now = f"Now: round {obs.round}, phase {obs.phase}."

        def diff(end: str) -> str:
            return "\n\n".join(p for p in (note, opening, f"{now} {end}") if p)

        tail = turn_tail(obs, bool(tools))
        variants: list[tuple[str, bool, str | None]] = [
            (diff(tail), True, None),
            (f"{note}\n\n{full_user}" if note else full_user, False, None),
        ]
        if not tools:
            variants.insert(0, (diff(turn_tail(obs, short=True)), True, schema_text(obs)))
        self._current = (obs, system, variants, tools, self.budget(reply_tokens))
        self._full = False

    def messages(self, extra: list[Message] | None = None) -> tuple[list[Message], dict[str, Any]]:
        """This decision's request (after :meth:`begin`): the system message, the kept turns and
        the current turn, then ``extra`` (a repair's messages), within the budget; and a record
        of how it was built (turns kept and dropped, tokens, the counter).

        The current turn is the shortest that the kept turns allow: a diff without the schema
        when a kept turn shows it, a diff when a kept turn shows the whole observation, else the
        whole observation."""
        obs, system, variants, tools, budget = self._current
        extra = list(extra or [])
        history = list(self.turns)
        dropped: list[Turn] = []
        if self.keep is not None:
            cut = max(0, len(history) - self.keep)
            dropped, history = history[:cut], history[cut:]
        digest: list[str] = []
        by_window = len(dropped)
        for user, needs_anchor, needs_text in variants:
            full = not needs_anchor

            if not _usable(history, needs_anchor, needs_text):
                continue
            digest = [t.digest for t in dropped] if self.kind == "summary" else []
            while True:
                messages = self._assemble(system, digest, history, user) + extra
                size = self.counter.messages(messages, tools)
                if budget is None or size <= budget:
                    break
                if history:
                    dropped.append(history.pop(0))
                    if self.kind == "summary":
                        digest = [t.digest for t in dropped]
                elif digest:
                    digest = digest[1:]
                else:
                    break  # the system message and the current turn alone: nothing to drop
            if _usable(history, needs_anchor, needs_text):
                break
        self._full = full
        self._user = user
        info = {
            "mode": self.mode,
            "turns": len(history),
            "dropped": len(dropped),
            "dropped_for_budget": len(dropped) - by_window,
            "digested": len(digest),
            "full_observation": full,
            "prompt_tokens": size,
            "budget": budget,
            "counter": self.counter.name,
            "over_budget": budget is not None and size > budget,
        }
        return messages, info

    @staticmethod
    def _assemble(system: str, digest: list[str], history: list[Turn], user: str) -> list[Message]:
        messages: list[Message] = [{"role": "system", "content": system}]
        for turn in history:
            messages += [dict(m) for m in turn.messages]
        messages.append({"role": "user", "content": user})
        if digest:
            first = messages[1]
            lines = "\n".join(f"- {line}" for line in digest)
            first["content"] = (
                f"Summary of your earlier turns (oldest first):\n{lines}\n\n{first['content']}"
            )
        return messages

    def remember(
        self,
        reply: Message | None,
        action: dict[str, Any] | None,
        fallback: bool,
        call_id: str | None = None,
    ) -> None:
        """Keep this decision as a turn (after :meth:`conversation`): its user message and the
        model's reply. A decision without any reply is not kept: the next turn says so."""
        obs, user, full = self._current[0], self._user, self._full
        if reply is None:
            self.note = (
                f"(Your turn in round {obs.round} ({obs.phase}) got no reply from the model; "
                f"the fallback {_short_action(action)} was played.)"
            )
            return
        self.turns.append(
            Turn(
                round=obs.round,
                phase=obs.phase,
                messages=[{"role": "user", "content": user}, reply],
                full=full,
                action=action,
                fallback=fallback,
                call_id=call_id,
            )
        )
        self.last_obs = obs
