"""Lenient JSON extraction from a model's reply: :func:`extract_json` finds the action object in
prose, code fences or near-JSON (single quotes, trailing commas, comments, Python's True/None)
and says what to send instead when there is none (the repair message's text)."""

from __future__ import annotations

import json
import re
from typing import Any

from market.core.actions import ActionParseError

MAX_REPLY_CHARS = 50_000  # only this much of a reply is searched for JSON

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|javascript|js)?[ \t]*\n?(.*?)```", re.DOTALL)
_PY_WORDS = {"True": "true", "False": "false", "None": "null"}


def _normalise(src: str) -> str:
    """Near-JSON to JSON: single-quoted strings, trailing commas, // and /* */ comments,
    Python's True/False/None. Strings are copied as they are (raw newlines stay for strict=False)."""
    out: list[str] = []
    i, n = 0, len(src)
    while i < n:
        ch = src[i]
        if ch in "\"'":
            quote, j, buf = ch, i + 1, []
            while j < n:
                c = src[j]
                if c == "\\" and j + 1 < n:
                    nxt = src[j + 1]
                    buf.append("'" if (quote == "'" and nxt == "'") else c + nxt)
                    j += 2
                    continue
                if c == quote:
                    break
                buf.append('\\"' if (quote == "'" and c == '"') else c)
                j += 1
            out.append('"' + "".join(buf) + '"')
            i = j + 1
        elif ch == "/" and src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end
        elif ch == "/" and src.startswith("/*", i):
            end = src.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif ch == ",":
            k = i + 1
            while k < n and src[k].isspace():
                k += 1
            if not (k < n and src[k] in "}]"):
                out.append(ch)
            i += 1
        elif ch.isalpha() or ch == "_":
            j = i
            while j < n and (src[j].isalnum() or src[j] == "_"):
                j += 1
            word = src[i:j]
            out.append(_PY_WORDS.get(word, word))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _balanced_objects(text: str, limit: int = 16) -> list[str]:
    """Top-level ``{...}`` spans in order (string- and escape-aware), at most ``limit``."""
    spans: list[str] = []
    start = text.find("{")
    while start >= 0 and len(spans) < limit:
        depth, quote, i, end = 0, "", start, -1
        while i < len(text):
            c = text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "\"'" and (c == '"' or text[i - 1] in "{[:, \n\t"):
                quote = c
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    end = i
                    break
            i += 1
        if end < 0:
            start = text.find("{", start + 1)
            continue
        spans.append(text[start : end + 1])
        start = text.find("{", end + 1)
    return spans


def _loads(candidate: str) -> Any:
    for attempt in (candidate, _normalise(candidate)):
        try:
            return json.loads(attempt, strict=False)
        except (json.JSONDecodeError, RecursionError):
            continue
    raise ValueError("not JSON")


def extract_json(text: str) -> Any:
    """The JSON object in a model reply: the whole reply, a fenced code block, or the first
    balanced ``{...}`` (one that has ``action_type`` preferred), repaired for trailing commas,
    single quotes, comments and Python literals. Raises :class:`ActionParseError` if none."""
    text = (text or "")[:MAX_REPLY_CHARS].strip()
    if not text:
        raise ActionParseError(
            'the reply was empty; send one JSON object such as {"action_type": "wait"}'
        )
    candidates = [text, *(m.group(1).strip() for m in _FENCE.finditer(text))]
    first: dict[str, Any] | None = None
    seen: set[str] = set()
    for candidate in [*candidates, *_balanced_objects(text)]:
        if candidate in seen or "{" not in candidate:
            continue
        seen.add(candidate)
        try:
            value = _loads(candidate)
        except ValueError:
            continue
        if isinstance(value, list) and value and isinstance(value[0], dict):
            value = value[0]
        if isinstance(value, dict):
            if "action_type" in value:
                return value
            first = value if first is None else first
    if first is not None:
        return first
    snippet = text[:80].replace("\n", " ")
    raise ActionParseError(
        f"no JSON object found in the reply ({snippet!r}...); send one JSON object such as "
        '{"action_type": "wait"} and nothing else'
    )
