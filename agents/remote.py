"""The ``remote`` agent: a seat played by an agent service at a URL, in any local run.

Spec: ``remote?url=http://127.0.0.1:9000&token_env=VARNAME&timeout=30`` (percent-encode a URL
holding ``&`` or ``?``). The service answers two JSON requests (docs/remote-agents.md, "Agent
services"):

- ``POST {url}/reset`` with ``{"seed": N}`` at the start of every episode, just before its first
  decision (``N``: the seat's derived seed, so a seeded agent there plays as it would locally);
- ``POST {url}/act`` with ``{"observation": {...}, "prompt": "...", "legal_actions": [...]}``,
  answered by ``{"action": {...}}``.

The bearer token, sent as ``Authorization: Bearer TOKEN``, comes from at most one of
``token_env=VARNAME`` (the environment variable, read when the agent is built), ``token_file=PATH``
(the file's text, surrounding whitespace stripped) or ``token=SECRET``. The first two keep it out
of the spec and so out of the command line; wherever a spec is shown or written, ``token=`` shows
as ``token=***`` anyway (:mod:`agents.specs_redact`), and error messages name the URL without its
user-info or secret query parameters. A request that fails, times out or answers without an
``action`` object raises, so the runner counts an agent error (or timeout) and the seat plays its
fallback for that turn, as for any other agent. The HTTP client (``httpx``)
is imported by the first request, so that resolving agents and starting a run load no HTTP stack.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.base import BaseAgent
from agents.specs_redact import redact_text, redact_url
from market.environment import Observation

if TYPE_CHECKING:
    import httpx


class RemoteAgentError(RuntimeError):
    """The agent service could not be reached or gave an unusable answer."""


def read_token(token: Any, token_env: Any, token_file: Any) -> str | None:
    """The bearer token from at most one of ``token``, ``token_env`` (a variable's name) and
    ``token_file`` (a path); ValueError with one line saying what is wrong."""
    given = [
        k
        for k, v in (("token", token), ("token_env", token_env), ("token_file", token_file))
        if v is not None
    ]
    if len(given) > 1:
        raise ValueError(f"give the token one way, not {' and '.join(given)}")
    if token_env is not None:
        value = os.environ.get(str(token_env), "").strip()
        if not value:
            raise ValueError(
                f"token_env={token_env}: the environment variable {token_env} is not set or empty"
            )
        return value
    if token_file is not None:
        try:
            value = Path(str(token_file)).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"token_file={token_file}: cannot read it ({type(exc).__name__}: "
                f"{getattr(exc, 'strerror', None) or exc})"
            ) from None
        if not value:
            raise ValueError(f"token_file={token_file}: the file is empty")
        return value
    return None if token is None or token == "" else str(token)


class RemoteAgent(BaseAgent):
    """An agent whose decisions come from an HTTP agent service (see the module docstring)."""

    name = "remote"
    roles = frozenset({"bidder", "designer"})

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30.0,
        token_env: str | None = None,
        token_file: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(
                f"url must be an http:// or https:// address, got {redact_url(str(url))!r}"
            )
        if not float(timeout) > 0:
            raise ValueError(f"timeout must be seconds > 0, got {timeout!r}")
        self.url = url.rstrip("/")
        self.shown_url = redact_url(self.url)  # what messages say: no user-info, no token
        self.timeout = float(timeout)
        token = read_token(token, token_env, token_file)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.stats = {"remote_requests": 0.0, "remote_failures": 0.0}
        self._client: httpx.Client | None = None
        self._reset: dict[str, Any] | None = None  # the reset not yet sent to the service

    def __getstate__(self) -> dict[str, Any]:  # picklable for process pools: no open client
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx  # the HTTP client, loaded by the first request (start-up time, issue 15)

        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout, headers=self.headers)
        self.stats["remote_requests"] += 1
        try:
            reply = self._client.post(f"{self.url}{path}", json=body)
        except httpx.HTTPError as exc:
            self.stats["remote_failures"] += 1
            raise RemoteAgentError(
                f"{self.shown_url}{path}: {type(exc).__name__}: {redact_text(str(exc))}"
            ) from None
        return self._read(path, reply)

    async def _apost(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx  # the HTTP client, loaded by the first request (start-up time, issue 15)

        self.stats["remote_requests"] += 1
        try:
            async with httpx.AsyncClient(timeout=self.timeout, headers=self.headers) as client:
                reply = await client.post(f"{self.url}{path}", json=body)
        except httpx.HTTPError as exc:
            self.stats["remote_failures"] += 1
            raise RemoteAgentError(
                f"{self.shown_url}{path}: {type(exc).__name__}: {redact_text(str(exc))}"
            ) from None
        return self._read(path, reply)

    def _read(self, path: str, reply: httpx.Response) -> dict[str, Any]:
        if reply.status_code >= 400:
            self.stats["remote_failures"] += 1
            raise RemoteAgentError(
                f"{self.shown_url}{path}: HTTP {reply.status_code}: {reply.text[:200]}"
            )
        try:
            data = reply.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            self.stats["remote_failures"] += 1
            raise RemoteAgentError(f"{self.shown_url}{path}: the answer is not a JSON object")
        return data

    def reset(self, seed: int | None = None) -> None:
        """Remember the seed; the service gets it (``POST /reset``) before the first decision,
        so an unreachable service costs that decision its fallback, not the episode."""
        super().reset(seed)
        self._reset = {"seed": seed}

    @staticmethod
    def request(observation: Observation) -> dict[str, Any]:
        """The body of an ``/act`` request for ``observation``."""
        return {
            "observation": observation.model_dump(mode="json"),
            "prompt": observation.to_prompt(),
            "legal_actions": list(observation.legal_actions),
        }

    def _action(self, data: dict[str, Any]) -> dict[str, Any]:
        action = data.get("action")
        if not isinstance(action, dict):
            self.stats["remote_failures"] += 1
            raise RemoteAgentError(f"{self.shown_url}/act: the answer has no 'action' object")
        return action

    def act(self, observation: Observation) -> dict[str, Any]:
        if self._reset is not None:
            self._post("/reset", self._reset)
            self._reset = None
        return self._action(self._post("/act", self.request(observation)))

    async def aact(self, observation: Observation) -> dict[str, Any]:
        if self._reset is not None:
            await self._apost("/reset", self._reset)
            self._reset = None
        return self._action(await self._apost("/act", self.request(observation)))
