"""The ``remote`` agent: a seat played by an agent service at a URL, in any local run.

Spec: ``remote?url=http://127.0.0.1:9000&token=SECRET&timeout=30`` (percent-encode a URL holding
``&`` or ``?``). The service answers two JSON requests (docs/remote-agents.md, "Agent services"):

- ``POST {url}/reset`` with ``{"seed": N}`` at the start of every episode, just before its first
  decision (``N``: the seat's derived seed, so a seeded agent there plays as it would locally);
- ``POST {url}/act`` with ``{"observation": {...}, "prompt": "...", "legal_actions": [...]}``,
  answered by ``{"action": {...}}``.

``token``, when given, is sent as ``Authorization: Bearer TOKEN``. A request that fails, times out
or answers without an ``action`` object raises, so the runner counts an agent error (or timeout)
and the seat plays its fallback for that turn, as for any other agent. The HTTP client (``httpx``)
is imported by the first request, so that resolving agents and starting a run load no HTTP stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agents.base import BaseAgent
from market.environment import Observation

if TYPE_CHECKING:
    import httpx


class RemoteAgentError(RuntimeError):
    """The agent service could not be reached or gave an unusable answer."""


class RemoteAgent(BaseAgent):
    """An agent whose decisions come from an HTTP agent service (see the module docstring)."""

    name = "remote"
    roles = frozenset({"bidder", "designer"})

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        super().__init__()
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// address, got {url!r}")
        if not float(timeout) > 0:
            raise ValueError(f"timeout must be seconds > 0, got {timeout!r}")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
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
            raise RemoteAgentError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None
        return self._read(path, reply)

    async def _apost(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx  # the HTTP client, loaded by the first request (start-up time, issue 15)

        self.stats["remote_requests"] += 1
        try:
            async with httpx.AsyncClient(timeout=self.timeout, headers=self.headers) as client:
                reply = await client.post(f"{self.url}{path}", json=body)
        except httpx.HTTPError as exc:
            self.stats["remote_failures"] += 1
            raise RemoteAgentError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None
        return self._read(path, reply)

    def _read(self, path: str, reply: httpx.Response) -> dict[str, Any]:
        if reply.status_code >= 400:
            self.stats["remote_failures"] += 1
            raise RemoteAgentError(
                f"{self.url}{path}: HTTP {reply.status_code}: {reply.text[:200]}"
            )
        try:
            data = reply.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            self.stats["remote_failures"] += 1
            raise RemoteAgentError(f"{self.url}{path}: the answer is not a JSON object")
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
            raise RemoteAgentError(f"{self.url}/act: the answer has no 'action' object")
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
