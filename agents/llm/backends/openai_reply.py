"""Reading an OpenAI-compatible chat reply, and writing the parts of a request servers disagree on.

A reply's parts: the text, the model's reasoning (a ``reasoning_content`` field as DeepSeek,
vLLM and llama-server send it, a ``reasoning`` field as Ollama, OpenRouter and Groq send it, or
a ``<think>...</think>`` block at the start of the content, which is then cut from the text),
the tool calls (``message.tool_calls``) and the reasoning tokens the server counted
(``usage.completion_tokens_details.reasoning_tokens``). Server errors are rendered with their
HTTP status and the server's own message, cut to :data:`ERROR_CHARS` characters. Which
failures are retried, and after how long, is read from the error here too.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from typing import Any

import openai

from agents.llm.backends.base import ToolCall

#: the longest server error text kept in a BackendError message
ERROR_CHARS = 400
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)
_OPEN_THINK = re.compile(r"^\s*<think>(.*)\Z", re.DOTALL)


def field_of(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]``, including fields the typed client model does not declare
    (kept in pydantic's ``model_extra``)."""
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:
        extra = getattr(obj, "model_extra", None) or {}
        value = extra.get(name)
    return value


def split_think(content: str) -> tuple[str, str | None]:
    """(text, reasoning): a leading ``<think>...</think>`` block is the reasoning; an unclosed
    leading ``<think>`` (the reply ran out of tokens while thinking) is all reasoning."""
    m = _THINK.match(content)
    if m:
        return content[m.end() :], m.group(1).strip()
    m = _OPEN_THINK.match(content)
    if m:
        return "", m.group(1).strip()
    return content, None


def reasoning_of(message: Any, content: str) -> tuple[str, str | None]:
    """(text, reasoning) of a reply message: the reasoning field first, then a ``<think>`` block
    (both are joined when a server sends both)."""
    field_text = None
    for name in ("reasoning_content", "reasoning"):
        value = field_of(message, name)
        if isinstance(value, str) and value.strip():
            field_text = value.strip()
            break
    text, think = split_think(content)
    parts = [p for p in (field_text, think) if p]
    return text, ("\n\n".join(parts) if parts else None)


def tool_calls_of(message: Any) -> list[ToolCall]:
    """The function calls of a reply message, in order; arguments kept as the JSON text (a
    server that sends them as an object gets them re-serialised)."""
    calls: list[ToolCall] = []
    for i, call in enumerate(field_of(message, "tool_calls") or []):
        function = field_of(call, "function")
        if function is None:
            continue
        arguments = field_of(function, "arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, sort_keys=True)
        calls.append(
            ToolCall(
                id=str(field_of(call, "id") or f"call_{i}"),
                name=str(field_of(function, "name") or ""),
                arguments=arguments,
            )
        )
    return calls


def reasoning_tokens_of(usage: Any) -> int:
    """Reasoning tokens the server reported (part of the completion tokens), else 0."""
    details = field_of(usage, "completion_tokens_details") if usage is not None else None
    if details is None:
        return 0
    try:
        return int(field_of(details, "reasoning_tokens") or 0)
    except (TypeError, ValueError):
        return 0


def wire_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as sent: ``content: None`` (an assistant tool-call turn) becomes ``""``,
    since llama.cpp's server answers HTTP 500 to a null content. The caller's list is not
    changed."""
    if all(m.get("content") is not None for m in messages):
        return messages
    return [m if m.get("content") is not None else {**m, "content": ""} for m in messages]


def server_error_text(body: Any, fallback: str) -> str:
    """The server's own error message from an error body (``{"error": {"message": ...}}``,
    ``{"detail": ...}``, ``{"message": ...}`` or text), else ``fallback``; cut to
    :data:`ERROR_CHARS` characters. An empty message says so, with the body."""
    text: Any = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            text = inner.get("message") or inner.get("detail") or inner.get("msg")
            if not text:
                text = f"(empty error message; body {json.dumps(body, default=str)})"
        else:
            text = inner
    elif isinstance(body, str) and body.strip():
        text = body
    message = str(text if text else fallback).strip()
    return message if len(message) <= ERROR_CHARS else message[: ERROR_CHARS - 3] + "..."


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked to wait (``retry-after-ms``, or ``retry-after`` in seconds or as
    an HTTP date), or None."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale)
        except ValueError:
            pass
    value = headers.get("retry-after")
    when = email.utils.parsedate_tz(value) if value else None
    if when is None:
        return None
    return max(0.0, email.utils.mktime_tz(when) - time.time())


def retry_reason(exc: BaseException) -> str | None:
    """Why a failed request may be retried (``rate_limited``, ``server_error``, ``connection``),
    or None: other 4xx statuses, timeouts and ``x-should-retry: false`` are final."""
    if isinstance(exc, openai.APIStatusError):
        if str(exc.response.headers.get("x-should-retry", "")).lower() == "false":
            return None
        if exc.status_code == 429:
            return "rate_limited"
        return "server_error" if exc.status_code >= 500 else None
    if isinstance(exc, openai.APITimeoutError):  # aiohttp reports a refused connection as a timeout
        return "connection" if connection_failure(exc) is not None else None
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    return None


def connection_failure(exc: BaseException) -> str | None:
    """The refused/unreachable-connection cause behind an error, if any (aiohttp reports a
    refused connection as a connect *timeout*)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ConnectionError) or type(seen).__name__ == "ClientConnectorError":
            return str(seen) or type(seen).__name__
        seen = seen.__cause__ or seen.__context__
    return None
