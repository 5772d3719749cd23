"""What an OpenAI-compatible endpoint can do, asked of the endpoint itself: tool calls and tokens.

:func:`probe_tools` sends one tiny request per (base URL, model) and process: a single ``ping``
function with the strongest tool choice the provider accepts (forced, else required, else auto).
The endpoint supports tools only if a ``ping`` call with a JSON object as arguments comes back.
An HTTP answer (a tool call or not, an error status) is final and cached in
:data:`TOOL_SUPPORT`; a transport failure (timeout, refused connection) answers False without
caching, so the next call probes again. Concurrent callers share one probe.

:func:`server_token_count` counts tokens with the server's own tokenizer: llama-cpp-python's
``POST /extras/tokenize/count`` (llama-server's ``POST /tokenize`` when that is missing) or
vLLM's ``POST /tokenize``, at the server root (``base_url`` without ``/v1``). A provider without
such an endpoint raises ``NotImplementedError`` so the caller falls back to its own budget.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import openai

from agents.llm.backends.base import BackendError, Completion

log = logging.getLogger(__name__)

PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "ping",
        "description": "Answer the ping.",
        "parameters": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
        },
    },
}
PROBE_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "Call the function ping with ok set to true."}
]
#: (base URL, model) -> whether a valid tool call came back; one probe per endpoint and process
TOOL_SUPPORT: dict[tuple[str, str], bool] = {}
_LOCK = threading.Lock()
_TASKS: dict[tuple[str, str], asyncio.Task[bool]] = {}
_TOKENIZE: dict[str, list[tuple[str, str]]] = {
    "llama-cpp-python": [("/extras/tokenize/count", "input"), ("/tokenize", "content")],
    "vllm": [("/tokenize", "prompt")],
}


def probe_params(backend: Any) -> dict[str, Any]:
    """The probe's request parameters: the strongest tool choice the provider accepts."""
    accepted = backend.provider.capabilities.tool_choice
    choice: Any = "auto"
    if "forced" in accepted:
        choice = {"type": "function", "function": {"name": "ping"}}
    elif "required" in accepted:
        choice = "required"
    return {"tools": [PROBE_TOOL], "tool_choice": choice, "max_tokens": 48, "temperature": 0.0}


def judge_probe(completion: Completion) -> tuple[bool, str]:
    """(supported, why) from the probe's reply."""
    for call in completion.tool_calls:
        if call.name != "ping":
            continue
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            return False, f"the ping call's arguments are not JSON: {call.arguments[:80]!r}"
        if isinstance(arguments, dict):
            return True, "a valid ping tool call came back"
        return False, f"the ping call's arguments are not an object: {call.arguments[:80]!r}"
    return False, f"no ping tool call came back (text: {completion.text[:80]!r})"


def _key(backend: Any) -> tuple[str, str]:
    return (str(backend.endpoint), str(backend.model))


def _known(backend: Any) -> bool | None:
    key = _key(backend)
    if key in TOOL_SUPPORT:
        if backend.tool_probe is None:
            backend.tool_probe = {"supported": TOOL_SUPPORT[key], "reason": "probed earlier"}
        return TOOL_SUPPORT[key]
    if not backend.provider.capabilities.tools:
        reason = f"tools not supported by {backend.provider.name} (preset): not probed"
        backend.tool_probe = {"supported": False, "reason": reason}
        TOOL_SUPPORT[key] = False
        return False
    return None


def _settle(backend: Any, outcome: Completion | BackendError) -> bool:
    key = _key(backend)
    if isinstance(outcome, Completion):
        supported, reason = judge_probe(outcome)
    elif outcome.status is not None:
        supported, reason = False, f"the server refused the probe: {outcome}"
    else:  # a transport failure says nothing about tools: not cached
        backend.tool_probe = {"supported": False, "reason": f"probe failed: {outcome}"}
        log.warning("tool probe of %s failed, will probe again: %s", key[0], outcome)
        return False
    TOOL_SUPPORT[key] = supported
    backend.tool_probe = {"supported": supported, "reason": reason}
    log.info("tool probe of %s (%s): %s", key[0], key[1], reason)
    return supported


def probe_tools(backend: Any) -> bool:
    """Whether ``backend``'s endpoint returns tool calls (see the module docstring)."""
    with _LOCK:  # concurrent threads wait for the one probe
        known = _known(backend)
        if known is not None:
            return known
        try:
            outcome: Completion | BackendError = backend.complete(
                PROBE_MESSAGES, None, probe_params(backend)
            )
        except BackendError as exc:
            outcome = exc
        return _settle(backend, outcome)


async def aprobe_tools(backend: Any) -> bool:
    """:func:`probe_tools` on the running event loop (concurrent callers await one probe)."""
    known = _known(backend)
    if known is not None:
        return known
    loop = asyncio.get_running_loop()
    key = _key(backend)
    task = _TASKS.get(key)
    if task is None or task.done() or task.get_loop() is not loop:
        task = _TASKS[key] = loop.create_task(_aprobe(backend))
    return await asyncio.shield(task)


async def _aprobe(backend: Any) -> bool:
    try:
        outcome: Completion | BackendError = await backend.acomplete(
            PROBE_MESSAGES, None, probe_params(backend)
        )
    except BackendError as exc:
        outcome = exc
    return _settle(backend, outcome)


def server_root(endpoint: str) -> str:
    """The server's root URL: ``base_url`` without a trailing ``/v1``."""
    root = endpoint.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def server_token_count(backend: Any, text: str) -> int:
    """Tokens of ``text`` by the server's tokenizer (see the module docstring)."""
    style = backend.provider.capabilities.tokenize
    if style is None:
        raise NotImplementedError(
            f"provider {backend.provider.name} has no tokenize endpoint; count tokens otherwise"
        )
    root, tried = server_root(backend.endpoint), []
    for path, field in _TOKENIZE[style]:
        body: dict[str, Any] = {field: text}
        if style == "vllm":
            body["model"] = backend.model
        try:
            reply = backend.post_json(root + path, body)
        except openai.NotFoundError:
            tried.append(path)
            continue
        except openai.OpenAIError as exc:
            raise BackendError(f"token count at {root}{path} failed: {exc}") from None
        if isinstance(reply, dict) and isinstance(reply.get("count"), int):
            return int(reply["count"])
        if isinstance(reply, dict) and isinstance(reply.get("tokens"), list):
            return len(reply["tokens"])
        raise BackendError(f"token count at {root}{path}: unexpected reply {str(reply)[:200]}")
    raise NotImplementedError(f"the server at {root} has none of {', '.join(tried)}")
