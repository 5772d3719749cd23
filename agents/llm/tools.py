"""Tool-call mode for LLM seats: ``mode=json|tools|auto``.

In ``tools`` mode the action types legal in the current phase are offered as OpenAI ``tools``: one
function per action type, named after it, whose parameters are that action's JSON schema as
:func:`agents.llm.prompts.legal_action_schema` simplifies it, less ``action_type`` (the function's
name says it). The request requires a tool call (``tool_choice="required"``), or forces the one
function when a single action type is legal. The reply's first tool call becomes the action
``{"action_type": name, **arguments}``, validated and repaired like a JSON reply.

In the conversation, a tool-call reply is an assistant message whose ``content`` is ``""`` (never
None: llama.cpp answers HTTP 500 to ``content: null``) with its ``tool_calls``, followed by a
``tool`` message carrying the result.

``auto`` asks the backend once per base URL and model whether it supports tools (the optional
hooks ``supports_tools()`` / ``asupports_tools()``; a backend without them counts as no) and uses
JSON mode where it does not, recording the fallback.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from agents.llm.backends.base import ToolCall
from agents.llm.parsing import extract_json
from agents.llm.prompts import legal_action_schema
from market.core.actions import ACTION_CLASSES, ActionParseError

Mode = Literal["json", "tools", "auto"]
MODES: tuple[str, ...] = ("json", "tools", "auto")
TOOLS_RULE = (
    "In this conversation you act by calling exactly one of the functions offered (one per "
    "legal action type) instead of writing the JSON object yourself."
)
#: (base URL, model) -> whether the endpoint takes tools; probed once per process
TOOL_SUPPORT: dict[tuple[str, str], bool] = {}


def tool_mode(value: str) -> Mode:
    """Check a ``mode=`` value."""
    text = str(value).strip().lower()
    if text not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {value!r}")
    return text  # type: ignore[return-value]


def _inner(backend: Any) -> Any:
    """The backend a wrapper (a response cache) wraps, else the backend itself."""
    inner = getattr(backend, "backend", None)
    return backend if inner is None else inner


def backend_hook(backend: Any, name: str) -> Any:
    """The optional hook ``name`` of a backend: a wrapper's own first (the response cache records
    probes and token counts, so an offline replay takes the same path), else the wrapped one's."""
    hook = getattr(backend, name, None)
    return hook if callable(hook) else getattr(_inner(backend), name, None)


def endpoint_key(backend: Any) -> tuple[str, str]:
    inner = _inner(backend)
    return (
        str(getattr(inner, "base_url", "") or ""),
        str(getattr(backend, "model", getattr(inner, "model", "?"))),
    )


def probe_tools(backend: Any) -> bool:
    """Whether the backend takes tools (its ``supports_tools()``, cached per endpoint); a
    backend without the hook, or whose probe fails, does not."""
    key = endpoint_key(backend)
    if key not in TOOL_SUPPORT:
        hook = backend_hook(backend, "supports_tools")
        try:
            TOOL_SUPPORT[key] = bool(hook()) if callable(hook) else False
        except Exception:
            TOOL_SUPPORT[key] = False
    return TOOL_SUPPORT[key]


async def aprobe_tools(backend: Any) -> bool:
    """:func:`probe_tools` through the async hook ``asupports_tools()`` (else the sync one)."""
    key = endpoint_key(backend)
    if key not in TOOL_SUPPORT:
        hook = backend_hook(backend, "asupports_tools")
        if not callable(hook):
            return probe_tools(backend)
        try:
            TOOL_SUPPORT[key] = bool(await hook())
        except Exception:
            TOOL_SUPPORT[key] = False
    return TOOL_SUPPORT[key]


def _description(kind: str) -> str:
    doc = (ACTION_CLASSES[kind].__doc__ or kind).strip().split("\n\n")[0]
    return " ".join(doc.replace("``", "`").split())[:300]


def action_tools(
    legal: list[str] | tuple[str, ...], reasoning_first: bool = False
) -> list[dict[str, Any]]:
    """One OpenAI function tool per legal action type, in the order of ``ACTION_CLASSES``.

    Parameters: the action's simplified schema without ``action_type``; with ``reasoning_first``
    a required ``reasoning`` string comes first."""
    tools: list[dict[str, Any]] = []
    for kind in (k for k in ACTION_CLASSES if k in set(legal)):
        schema = copy.deepcopy(legal_action_schema([kind]))
        props = {k: v for k, v in schema.get("properties", {}).items() if k != "action_type"}
        required = [r for r in schema.get("required", []) if r != "action_type"]
        if reasoning_first:
            props = {
                "reasoning": {"type": "string"},
                **{k: v for k, v in props.items() if k != "reasoning"},
            }
            required = ["reasoning", *[r for r in required if r != "reasoning"]]
        params: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        if "$defs" in schema:
            params["$defs"] = schema["$defs"]
        tools.append(
            {
                "type": "function",
                "function": {"name": kind, "description": _description(kind), "parameters": params},
            }
        )
    return tools


def tool_choice(tools: list[dict[str, Any]]) -> Any:
    """``"required"``, or the one function forced when only one is offered."""
    if len(tools) == 1:
        return {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
    return "required"


def call_to_action(call: ToolCall) -> dict[str, Any]:
    """``{"action_type": name, **arguments}``; raises :class:`ActionParseError` (the repair text)
    when the arguments are not a JSON object."""
    raw = (call.arguments or "").strip() or "{}"
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        args = extract_json(raw)  # lenient, raises ActionParseError with a hint
    if not isinstance(args, dict):
        raise ActionParseError(
            f"the arguments of {call.name} must be a JSON object, got {raw[:80]!r}"
        )
    args.pop("action_type", None)
    return {"action_type": call.name, **args}


def assistant_tool_message(call: ToolCall) -> dict[str, Any]:
    """The assistant turn of a tool-call reply (``content`` is ``""``, never None)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ],
    }


def tool_result_message(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def decision_mode(mode: str, backend: Any, supported: bool | None) -> tuple[str, tuple[str, ...]]:
    """The mode of one decision and the degraded features to record: ``auto`` is ``tools`` where
    the backend supports them, else ``json`` with the fallback named."""
    if mode != "auto":
        return mode, ()
    if supported:
        return "tools", ()
    where = " ".join(p for p in endpoint_key(backend) if p)
    return "json", (f"tools: {where} does not support tool calls; JSON mode used (mode=auto)",)
