"""Reasoning for LLM seats: ``reasoning=none|field|native``.

- ``none``: the prompt and the request are unchanged.
- ``field``: the model is asked for a short ``"reasoning"`` string *before* the action fields in
  the same JSON object; the schema lists ``reasoning`` first in ``properties`` and ``required``, so
  a constrained decoder writes it first too.
- ``native``: the request carries the server's reasoning control (``reasoning_effort``); a
  reasoning model returns its reasoning separately (``Completion.reasoning``) or inline in
  ``<think>...</think>`` blocks.

Whatever the mode, ``<think>`` blocks are cut out of a reply before it is parsed (an unclosed
block runs to the end of the reply), so reasoning is never read as an action. The reasoning text
(field, server or blocks) is recorded in the decision's exchange and its tokens are counted.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any, Literal

ReasoningMode = Literal["none", "field", "native"]
REASONING_MODES: tuple[str, ...] = ("none", "field", "native")
REASONING_EFFORTS: tuple[str, ...] = ("minimal", "low", "medium", "high")
FIELD_RULE = (
    'Think first: start the JSON object with a short "reasoning" string (one or two sentences: '
    'what you want and why), then "action_type" and the action\'s fields.'
)

_THINK = re.compile(r"<think(?:ing)?>(.*?)(?:</think(?:ing)?>|\Z)", re.DOTALL | re.IGNORECASE)


def reasoning_mode(value: str) -> ReasoningMode:
    """Check a ``reasoning=`` value."""
    text = str(value).strip().lower()
    if text not in REASONING_MODES:
        raise ValueError(f"reasoning must be one of {', '.join(REASONING_MODES)}, got {value!r}")
    return text  # type: ignore[return-value]


def effort_value(value: str) -> str:
    """Check a ``reasoning_effort=`` value."""
    text = str(value).strip().lower()
    if text not in REASONING_EFFORTS:
        raise ValueError(
            f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {value!r}"
        )
    return text


def split_think(text: str | None) -> tuple[str, str]:
    """``(reply without its <think> blocks, the blocks' text)``; an unclosed block runs to the
    end of the reply (a reply cut by ``max_tokens`` inside its reasoning has no action)."""
    text = text or ""
    if "<think" not in text.lower():
        return text, ""
    thoughts = [m.group(1).strip() for m in _THINK.finditer(text)]
    return _THINK.sub("", text).strip(), "\n".join(t for t in thoughts if t)


def with_reasoning_first(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an action schema whose every object variant takes a ``reasoning`` string first
    (first in ``properties`` and in ``required``)."""
    out = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict) and "action_type" in props:
                rest = {k: v for k, v in props.items() if k != "reasoning"}
                node["properties"] = {"reasoning": {"type": "string"}, **rest}
                node["required"] = [
                    "reasoning",
                    *[r for r in node.get("required", []) if r != "reasoning"],
                ]
            for key in ("anyOf", "oneOf"):
                for sub in node.get(key, []):
                    visit(sub)
            for sub in node.get("$defs", {}).values():
                visit(sub)

    visit(out)
    return out


def reasoning_text(parts: list[str | None]) -> str | None:
    """The non-empty parts joined (server reasoning, <think> blocks, the field), or None."""
    kept = [p.strip() for p in parts if isinstance(p, str) and p.strip()]
    return "\n".join(kept) if kept else None


def reasoning_tokens(
    outcome: Any, parts: list[str | None], count: Callable[[str], int]
) -> tuple[str | None, int]:
    """A reply's reasoning text and its tokens: as the server reports them
    (``extra["reasoning_tokens"]``), else counted with ``count``."""
    text = reasoning_text(parts)
    extra = getattr(outcome, "extra", None)
    reported = extra.get("reasoning_tokens") if isinstance(extra, dict) else None
    if isinstance(reported, int) and not isinstance(reported, bool):
        return text, reported
    return text, count(text) if text else 0
