"""The prompt-only stand-in model served as an OpenAI-compatible chat-completions endpoint.

``python -m market.serve.stand_in --port 8090`` prints ``READY http://127.0.0.1:8090/v1`` and
serves until interrupted; a seat plays it as
``llm:openai?model=stand-in&base_url=http://127.0.0.1:8090/v1``. Every reply is the action of
:func:`agents.llm.stand_in.decide`, computed from the request's messages alone (docs/llm-seats.md,
"The prompt-only stand-in").

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /healthz``. The rules:

- it binds 127.0.0.1 only; a request is data: nothing in it is run, fetched or stored;
- a body is read in full, at most ``max_body`` bytes (:data:`MAX_BODY`), before it is parsed
  (413 otherwise, 408 for one still arriving after 10 s; :class:`~market.serve.guards.BodyLimit`),
  and a browser page of another origin may not post (403, :class:`~market.serve.guards.OriginGuard`);
- a request that is not a chat completion this server can answer gets an OpenAI-style error
  ``{"error": {"message", "type", "param", "code"}}``: 400 for a body that is not JSON, a field of
  the wrong type, no ``messages``, ``stream`` or ``n > 1``; 404 for another model's name;
- the answer honours the request: with ``response_format`` ``json_schema`` the action is an
  action type the schema admits (wrapped as ``{"action": ...}`` when the schema's root is that
  wrapper, OpenAI's strict form), with ``json_object`` or none it is the JSON object; with
  ``tools`` it is a call of the tool named like the action (``tool_choice`` forcing a function:
  that one); a reply longer than ``max_tokens`` is cut there (``finish_reason`` ``length``);
- ``usage`` counts about 4 characters a token: prompt tokens are the characters of every
  message's text // 4, completion tokens the reply's (at least 1).
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agents.llm.stand_in import content_text, decide
from market.serve.guards import DEFAULT_BODY_TIMEOUT_S, BodyLimit, OriginGuard
from market.serve.http_protocol import protocol_class

#: the model name the server answers to by default
MODEL = "stand-in"
#: the largest request body read (bytes): a seat's request with a full 8,192-token conversation
#: is about 40 KB, so this leaves room for far longer ones
MAX_BODY = 1024 * 1024
#: the most messages, tools and characters of one text part a request may carry
MAX_MESSAGES = 512
MAX_TOOLS = 64
CHARS_PER_TOKEN = 4


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=64)
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, tool_call_id
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")  # json_object's "schema" (llama.cpp's form)
    type: Literal["json_schema", "json_object", "text"]
    json_schema: dict[str, Any] | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # temperature, seed, max_tokens... are taken
    model: str = Field(min_length=1, max_length=256)
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    n: int = Field(default=1, ge=1)


def error_body(message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """One line naming every field that is wrong (at most 5) and what was expected, and the first
    field's dotted path; a body that is not JSON says so."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return "the request body is not valid JSON", None
    parts = []
    for error in errors[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    first = errors[0].get("loc", ()) if errors else ()
    param = ".".join(str(p) for p in first if p != "body") or None
    return "invalid request: " + "; ".join(parts), param


def schema_action_types(schema: Any) -> set[str]:
    """Every ``action_type`` constant (or enum value) a JSON schema names, at any depth."""
    found: set[str] = set()
    if isinstance(schema, dict):
        props = schema.get("properties")
        kind = props.get("action_type") if isinstance(props, dict) else None
        if isinstance(kind, dict):
            if isinstance(kind.get("const"), str):
                found.add(kind["const"])
            found.update(v for v in kind.get("enum", ()) if isinstance(v, str))
        for value in schema.values():
            found |= schema_action_types(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= schema_action_types(value)
    return found


def strict_wrapper(schema: Any) -> bool:
    """Whether a schema's root is OpenAI strict mode's ``{"action": ...}`` wrapper."""
    if not isinstance(schema, dict):
        return False
    props = schema.get("properties")
    return isinstance(props, dict) and set(props) == {"action"}


def fit_schema(action: dict[str, Any], schema: Any) -> dict[str, Any]:
    """``action`` when the schema admits its type (or names none); else ``wait`` when admitted,
    else an empty bid when admitted; else ``action`` unchanged (the seat's checks then say why)."""
    allowed = schema_action_types(schema)
    if not allowed or action.get("action_type") in allowed:
        return action
    if "wait" in allowed:
        return {"action_type": "wait"}
    if "bid" in allowed:
        return {"action_type": "bid", "bids": []}
    return action


def tool_call(action: dict[str, Any], tools: list[dict[str, Any]], choice: Any) -> dict[str, Any]:
    """The tool call for ``action``: the function ``choice`` forces, else the tool named like the
    action type, else the first tool; arguments are the action's other fields when it is the
    action's own tool, else ``{}``."""
    names = [str((t.get("function") or {}).get("name", "")) for t in tools]
    forced = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    kind = str(action.get("action_type", ""))
    name = str(forced) if forced else (kind if kind in names else (names[0] if names else kind))
    args = {k: v for k, v in action.items() if k != "action_type"} if name == kind else {}
    return {
        "id": "call_0",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, separators=(",", ":"))},
    }


def count_tokens(text: str) -> int:
    """The usage count: :data:`CHARS_PER_TOKEN` characters a token."""
    return len(text) // CHARS_PER_TOKEN


def completion(body: ChatRequest, ident: str, now: int) -> dict[str, Any]:
    """The ``chat.completion`` answering ``body`` (see the module docstring)."""
    messages = [m.model_dump() for m in body.messages]
    action = decide(messages)
    fmt = body.response_format
    schema = None
    if fmt is not None and fmt.type == "json_schema":
        schema = (fmt.json_schema or {}).get("schema")
    elif fmt is not None and fmt.type == "json_object":
        schema = (fmt.model_extra or {}).get("schema")
    action = fit_schema(action, schema)
    message: dict[str, Any] = {"role": "assistant", "content": None}
    finish = "stop"
    if body.tools:
        call = tool_call(action, body.tools, body.tool_choice)
        message["tool_calls"] = [call]
        reply = call["function"]["arguments"]
        finish = "tool_calls"
    else:
        reply = json.dumps({"action": action} if strict_wrapper(schema) else action)
        limit = body.max_completion_tokens or body.max_tokens
        if limit is not None and count_tokens(reply) > limit:
            reply, finish = reply[: limit * CHARS_PER_TOKEN], "length"
        message["content"] = reply
    prompt = "".join(content_text(m.get("content")) for m in messages)
    used = (count_tokens(prompt), max(1, count_tokens(reply)))
    return {
        "id": ident,
        "object": "chat.completion",
        "created": now,
        "model": body.model,
        "system_fingerprint": "stand-in",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": used[0],
            "completion_tokens": used[1],
            "total_tokens": used[0] + used[1],
        },
    }


def stand_in_app(
    model: str = MODEL,
    *,
    max_body: int = MAX_BODY,
    read_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> FastAPI:
    """The FastAPI app of the stand-in model named ``model`` (see the module docstring)."""
    app = FastAPI(title=f"gpumarket prompt-only stand-in model ({model})")
    ids = itertools.count()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        return JSONResponse(error_body(message, param, "invalid_request"), status_code=400)

    @app.get("/healthz")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        entry = {"id": model, "object": "model", "created": 0, "owned_by": "gpumarket"}
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions", response_model=None)
    def chat(body: ChatRequest) -> dict[str, Any] | JSONResponse:
        if body.model != model:
            text = f"model {body.model[:80]!r} is not served here; this server serves {model!r}"
            return JSONResponse(error_body(text, "model", "model_not_found"), status_code=404)
        if body.stream:
            text = "stream=true is not supported; send stream=false"
            return JSONResponse(error_body(text, "stream", "unsupported"), status_code=400)
        if body.n != 1:
            text = f"n={body.n} is not supported; this server returns one choice"
            return JSONResponse(error_body(text, "n", "unsupported"), status_code=400)
        return completion(body, f"chatcmpl-standin-{next(ids)}", int(time.time()))

    app.add_middleware(BodyLimit, limit=max_body, read_timeout_s=read_timeout_s)
    app.add_middleware(OriginGuard)
    return app


def bind(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port`` (0: a free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


def main(argv: list[str] | None = None) -> int:
    """``python -m market.serve.stand_in [--port 8090] [--model stand-in]``: serve until killed."""
    parser = argparse.ArgumentParser(
        prog="python -m market.serve.stand_in",
        description="Serve the prompt-only stand-in model (OpenAI-compatible) on 127.0.0.1.",
        epilog="example: python -m market.serve.stand_in --port 8090, then seat "
        "llm:openai?model=stand-in&base_url=http://127.0.0.1:8090/v1",
    )
    parser.add_argument("--port", type=int, default=8090, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument("--model", default=MODEL, help=f"the model name served (default {MODEL})")
    parser.add_argument(
        "--max-body", type=int, default=MAX_BODY, help="largest request body in bytes"
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535 or args.max_body < 1:
        parser.error("--port must be 0..65535 and --max-body at least 1")
    try:
        sock = bind(args.port)
    except OSError as exc:
        print(f"cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    app = stand_in_app(args.model, max_body=args.max_body)
    config = uvicorn.Config(app, log_level="warning", http=protocol_class())
    print(f"READY http://127.0.0.1:{port}/v1", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
