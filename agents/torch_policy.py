"""A trained torch policy (``market.train.rl_train``) in any bidder or designer seat.

Spec: ``torch_policy?path=CHECKPOINT`` (greedy: the argmax over the masked logits), or
``torch_policy?path=CHECKPOINT&sample=true`` to sample from the masked softmax with a
``torch.Generator`` seeded from the seat's seed. The agent sees only its seat's observation; it
turns it into the RL view (:func:`market.environment.wrappers.seat_rl_observation`) and plays the chosen menu
entry's native action. torch is imported only when the agent is built.
"""

from __future__ import annotations

from typing import Any

from agents.base import BaseAgent, as_flag
from market.core.actions import ActionModel
from market.environment.observations import Observation

TORCH_HINT = "needs torch: pip install 'gpumarket[rl]'"


def _import_torch() -> Any:
    """torch, or a ValueError (the registry reports it as a one-line spec error)."""
    try:
        import torch
    except ImportError:
        raise ValueError(TORCH_HINT) from None
    return torch


class TorchPolicyAgent(BaseAgent):
    """A policy trained with ``gpumarket train`` (torch_policy?path=FILE[&sample=true])."""

    name = "torch_policy"
    roles = frozenset({"bidder", "designer"})

    def __init__(self, path: str = "", sample: bool | str = False,
                 max_units_per_bid: int | None = None) -> None:
        super().__init__()
        if not path:
            raise ValueError("give the checkpoint: torch_policy?path=FILE")
        self.torch = _import_torch()
        from market.train.rl_train import load_checkpoint

        self.net, self.meta = load_checkpoint(path)
        self.path = str(path)
        self.sample = as_flag(sample, "sample")
        # the env's unit-bid cap comes from the scenario, which an agent is not given
        self.max_units_per_bid = int(self.meta.get("max_units_per_bid", 0)
                                     if max_units_per_bid is None else max_units_per_bid)
        self.generator = self.torch.Generator().manual_seed(0)

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        # a torch seed must fit in 64 bits; the seat seed is derived from the episode's streams
        self.generator = self.torch.Generator().manual_seed(int(seed or 0) % 2**63)

    def menu_index(self, observation: Observation) -> int:
        """The menu entry the policy picks for this observation."""
        from market.environment.wrappers import seat_rl_observation
        from market.train.rl_train import choose

        rl_obs = seat_rl_observation(observation, self.max_units_per_bid)
        return choose(self.net, rl_obs["observation"], rl_obs["action_mask"],
                      self.generator if self.sample else None)

    def act(self, observation: Observation) -> ActionModel:
        from market.environment.wrappers import translate

        return translate(observation, self.menu_index(observation), self.max_units_per_bid)[0]
