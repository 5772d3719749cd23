"""A typed Python client of the market's OpenEnv server, on OpenEnv's ``EnvClient`` (one
WebSocket session per client).

Async by default, as OpenEnv's clients are; ``.sync()`` gives the blocking wrapper::

    with MarketEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(scenario="single_trade", seat="bidder_0", seed=7)
        while not result.done:
            result = env.step({"action_type": "wait"})

``step`` takes a :class:`~market.serve.openenv_env.MarketAction`, an action model of
:mod:`market.core.actions`, or the action as a dict or JSON text. Results are OpenEnv
``StepResult`` objects whose ``observation`` is a
:class:`~market.serve.openenv_env.MarketObservation`; a server error (a bad reset option, a
malformed message) raises ``RuntimeError`` with the server's one-line reason. A session the server
closed (idle past its ``--idle-timeout``) is reopened by the next call, as OpenEnv's client
reopens a closed socket; its episode is gone, so that call should be a ``reset``.
"""

from __future__ import annotations

from typing import Any, cast

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from pydantic import BaseModel

from market.serve.openenv_env import MarketAction, MarketObservation, MarketState


class MarketEnvClient(EnvClient[MarketAction, MarketObservation, MarketState]):  # type: ignore[misc]
    """The market's OpenEnv client (see the module docstring)."""

    def _step_payload(self, action: Any) -> dict[str, Any]:
        if isinstance(action, MarketAction):
            return cast(dict[str, Any], action.model_dump(mode="json"))
        if isinstance(action, BaseModel):  # an action model of market.core.actions
            action = action.model_dump(mode="json", exclude_none=True)
        return cast(dict[str, Any], MarketAction(action=action).model_dump(mode="json"))

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MarketObservation]:
        fields = dict(payload.get("observation") or {})
        fields["reward"] = payload.get("reward")
        fields["done"] = bool(payload.get("done", False))
        obs = MarketObservation.model_validate(fields)
        return StepResult(
            observation=obs,
            reward=payload.get("reward"),
            done=obs.done,
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> MarketState:
        return cast(MarketState, MarketState.model_validate(payload))


__all__ = ["MarketEnvClient"]
