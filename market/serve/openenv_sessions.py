"""The OpenEnv server's WebSocket sessions (``/ws``), served by this module in place of OpenEnv's
own handler: the same messages, replies and error codes for an honest client (OpenEnv's
``EnvClient``, :class:`~market.serve.openenv_client.MarketEnvClient`), with these rules.

- **Capacity.** At most ``max_sessions`` sessions at once, and at most
  ``max_sessions_per_client`` from one remote address. One more is answered with a
  ``CAPACITY_REACHED`` error message and closed, as OpenEnv does.
- **Idle sessions.** A session whose client sends nothing for ``idle_timeout_s`` seconds while
  none of its messages is being served is closed with WebSocket close code 1001 and a reason that
  says so (ping frames do not count: they are not messages). The session's episode ends; the
  ``MarketEnvClient`` reconnects by itself on its next call, which must be a reset.
- **Malformed input never ends a session**; each gets one error reply and leaves the session as
  it was: a binary frame, a text that is not JSON, JSON nested deeper than
  :data:`MAX_JSON_DEPTH`, a text holding a lone UTF-16 surrogate (``"\\ud800"``: not Unicode text),
  and JSON that is not an object are ``INVALID_JSON``; an object that is not a valid message is
  ``VALIDATION_ERROR``; an unknown ``type`` is ``UNKNOWN_TYPE``; a reset the env refuses (a bad
  option) or a failing step is ``EXECUTION_ERROR``. Nothing is applied before a message passed
  these checks.
- **Messages in flight.** A client may send up to :data:`MAX_PENDING` messages ahead of their
  replies; one more closes the session (close code 1008). Honest clients send one at a time.
- **A client that leaves ends its work**: the session's env is cancelled, so a reset or step in
  progress stops at the next seat's turn, and the env is closed.
- :meth:`Sessions.stop` (the server is stopping) cancels every session's env and every env an
  HTTP request built, so a SIGTERM is not held up by work in progress.

Each session has its own env (its own AEC env, agents and random streams) on its own worker
thread; its messages are served in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from fastapi import WebSocket
from openenv.core.env_server.serialization import deserialize_action, serialize_observation
from openenv.core.env_server.types import (
    WSCloseMessage,
    WSErrorCode,
    WSErrorResponse,
    WSObservationResponse,
    WSResetMessage,
    WSStateMessage,
    WSStateResponse,
    WSStepMessage,
)
from pydantic import ValidationError

from market.serve.openenv_env import MarketAction, MarketEnvironment, short_repr

DEFAULT_IDLE_TIMEOUT_S = 300.0
MAX_JSON_DEPTH = 32  # an honest message nests 5 or 6 levels (a reset's overrides)
MAX_PENDING = 8  # messages a client may send ahead of their replies
CLOSE_IDLE = 1001  # "going away": the server ends an idle session
CLOSE_FLOODED = 1008  # "policy violation": too many messages ahead of their replies


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why decoded JSON ``value`` may not be served (nested too deep, a lone surrogate in a
    string or key), or None. Iterative: a deep value cannot exhaust the stack here."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if not _is_text(item):
                return (
                    "the message holds a lone UTF-16 surrogate (an escape such as \\ud800 "
                    "without its pair), which is not Unicode text; send valid text"
                )
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                return f"the message nests deeper than {max_depth} levels; send flatter JSON"
            if isinstance(item, dict):
                stack.extend((key, depth + 1) for key in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)
    return None


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _error(message: str, code: WSErrorCode, **extra: Any) -> str:
    return cast(
        str, WSErrorResponse(data={"message": message, "code": code, **extra}).model_dump_json()
    )


class _Refused(Exception):
    """A session this server will not open; the message says why."""

    def __init__(self, message: str, **data: int) -> None:
        super().__init__(message)
        self.data = data


@dataclass(eq=False)
class _Session:
    client: str
    env: MarketEnvironment
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="openenv-session")
    )


class Sessions:
    """The server's WebSocket sessions and their limits (see the module docstring).

    ``factory`` builds one env; :meth:`factory_for_requests` wraps it for OpenEnv's stateless
    HTTP routes so that :meth:`stop` reaches their envs too. :meth:`serve` is the ``/ws`` route.
    """

    def __init__(
        self,
        factory: Callable[[], MarketEnvironment],
        max_sessions: int,
        max_sessions_per_client: int,
        idle_timeout_s: float,
    ) -> None:
        if max_sessions < 1 or max_sessions_per_client < 1:
            raise ValueError(
                "max_sessions and max_sessions_per_client must be at least 1, got "
                f"{max_sessions} and {max_sessions_per_client}"
            )
        if not idle_timeout_s > 0:
            raise ValueError(f"idle_timeout_s must be above 0 seconds, got {idle_timeout_s}")
        self.factory = factory
        self.max_sessions = max_sessions
        self.max_sessions_per_client = max_sessions_per_client
        self.idle_timeout_s = float(idle_timeout_s)
        self.stopping = False
        self._open: set[_Session] = set()
        self._per_client: Counter[str] = Counter()
        self._request_envs: weakref.WeakSet[MarketEnvironment] = weakref.WeakSet()

    # --- bookkeeping (event loop only) ---------------------------------------------------
    @property
    def active(self) -> int:
        return len(self._open)

    def factory_for_requests(self) -> MarketEnvironment:
        """An env for one stateless HTTP request, cancelled by :meth:`stop` like a session's."""
        env = self.factory()
        self._request_envs.add(env)
        if self.stopping:
            env.cancel()
        return env

    def stop(self) -> None:
        """The server is stopping: cancel the work of every session and HTTP request."""
        self.stopping = True
        for session in list(self._open):
            session.env.cancel()
        for env in list(self._request_envs):
            env.cancel()

    def _admit(self, client: str) -> _Session:
        if self.stopping:
            raise _Refused("the server is stopping; connect again later")
        if len(self._open) >= self.max_sessions:
            raise _Refused(
                f"Server at capacity: {len(self._open)}/{self.max_sessions} sessions active. "
                "Cannot accept new connections.",
                active_sessions=len(self._open),
                max_sessions=self.max_sessions,
            )
        held = self._per_client[client]
        if held >= self.max_sessions_per_client:
            raise _Refused(
                f"this client ({client}) already holds {held} sessions, the most one client may "
                "hold on this server (--max-sessions-per-client); close one first",
                client_sessions=held,
                max_sessions_per_client=self.max_sessions_per_client,
            )
        session = _Session(client, self.factory())
        self._open.add(session)
        self._per_client[client] += 1
        return session

    def _release(self, session: _Session) -> None:
        if session in self._open:
            self._open.discard(session)
            self._per_client[session.client] -= 1
            if self._per_client[session.client] <= 0:
                del self._per_client[session.client]

    # --- the /ws route -------------------------------------------------------------------
    async def serve(self, websocket: WebSocket) -> None:
        """One WebSocket connection: one session, until the client closes it, leaves, idles
        past the timeout or floods."""
        await websocket.accept()
        client = websocket.client.host if websocket.client else "unknown"
        try:
            session = self._admit(client)
        except _Refused as exc:
            with contextlib.suppress(Exception):
                await websocket.send_text(
                    _error(str(exc), WSErrorCode.CAPACITY_REACHED, **exc.data)
                )
                await websocket.close()
            return
        try:
            await self._run(websocket, session)
        finally:
            self._release(session)
            session.env.cancel()  # whatever is still queued for it stops at once
            loop = asyncio.get_running_loop()
            with contextlib.suppress(Exception):  # close in the thread the env lives on
                await loop.run_in_executor(session.executor, session.env.close)
            session.executor.shutdown(wait=False)

    async def _run(self, websocket: WebSocket, session: _Session) -> None:
        inbox: asyncio.Queue[Mapping[str, Any] | None] = asyncio.Queue()
        flooded = False

        async def read() -> None:
            """Read every frame as it comes, so that a client leaving is seen at once, even
            while a message of it is being served."""
            nonlocal flooded
            try:
                while True:
                    frame = await websocket.receive()
                    if frame["type"] != "websocket.receive":
                        return  # websocket.disconnect
                    if inbox.qsize() >= MAX_PENDING:
                        flooded = True
                        return
                    inbox.put_nowait(frame)
            except Exception:  # the connection broke: the same as leaving
                return
            finally:
                session.env.cancel()  # the client left or flooded: stop its work now
                inbox.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                try:
                    frame = await asyncio.wait_for(inbox.get(), self.idle_timeout_s)
                except TimeoutError:
                    await self._close(
                        websocket,
                        CLOSE_IDLE,
                        f"session idle for more than {self.idle_timeout_s:g} s; reconnect "
                        "and reset",
                    )
                    return
                if flooded:
                    await self._close(
                        websocket,
                        CLOSE_FLOODED,
                        f"more than {MAX_PENDING} messages awaited replies; send one message "
                        "at a time",
                    )
                    return
                if frame is None or reader.done():  # the client left: nobody reads replies
                    return
                reply = await self._answer(session, frame)
                if reply is None:  # a close message
                    await self._close(websocket, 1000, "")
                    return
                try:
                    await websocket.send_text(reply)
                except Exception:  # the client left while its message was served
                    return
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    @staticmethod
    async def _close(websocket: WebSocket, code: int, reason: str) -> None:
        with contextlib.suppress(Exception):
            await websocket.close(code=code, reason=reason)

    async def _answer(self, session: _Session, frame: Mapping[str, Any]) -> str | None:
        """The reply to one frame (JSON text), or None for a close message."""
        text = frame.get("text")
        if text is None:
            return _error(
                "binary frames are not served; send each message as a JSON text frame",
                WSErrorCode.INVALID_JSON,
            )
        try:
            message = json.loads(text)
        except json.JSONDecodeError as exc:
            return _error(f"Invalid JSON: {exc}", WSErrorCode.INVALID_JSON)
        except RecursionError:
            return _error(
                f"the message nests deeper than {MAX_JSON_DEPTH} levels; send flatter JSON",
                WSErrorCode.INVALID_JSON,
            )
        except ValueError as exc:  # e.g. an integer of more digits than Python converts
            return _error(f"Invalid JSON: {exc}", WSErrorCode.INVALID_JSON)
        problem = json_problem(message)
        if problem is not None:
            return _error(problem, WSErrorCode.INVALID_JSON)
        if not isinstance(message, dict):
            return _error(
                'a message must be a JSON object, e.g. {"type": "reset", "data": {}}',
                WSErrorCode.INVALID_JSON,
            )
        kind = message.get("type", "")
        try:
            return await self._dispatch(session, kind, message)
        except ValidationError as exc:
            errors = exc.errors(include_url=False, include_context=False, include_input=False)
            return _error("Invalid message", WSErrorCode.VALIDATION_ERROR, errors=errors)
        except Exception as exc:  # a bad reset option, a failing step: one line, no traceback
            message_text = " ".join(str(exc).split()) or type(exc).__name__
            return _error(message_text, WSErrorCode.EXECUTION_ERROR)

    async def _dispatch(self, session: _Session, kind: Any, message: dict[str, Any]) -> str | None:
        loop = asyncio.get_running_loop()
        env = session.env
        match kind:
            case "reset":
                data = WSResetMessage.model_validate(message).data
                observation = await loop.run_in_executor(
                    session.executor, lambda: env.reset(**data)
                )
                return cast(
                    str,
                    WSObservationResponse(
                        data=serialize_observation(observation)
                    ).model_dump_json(),
                )
            case "step":
                action = deserialize_action(
                    WSStepMessage.model_validate(message).data, MarketAction
                )
                observation = await loop.run_in_executor(session.executor, lambda: env.step(action))
                return cast(
                    str,
                    WSObservationResponse(
                        data=serialize_observation(observation)
                    ).model_dump_json(),
                )
            case "state":
                WSStateMessage.model_validate(message)
                return cast(str, WSStateResponse(data=env.state.model_dump()).model_dump_json())
            case "close":
                WSCloseMessage.model_validate(message)
                return None
            case _:
                return _error(
                    f"Unknown message type: {short_repr(kind)}; send reset, step, state or close",
                    WSErrorCode.UNKNOWN_TYPE,
                )


__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "MAX_JSON_DEPTH",
    "MAX_PENDING",
    "Sessions",
    "json_problem",
]
