"""A trained torch policy in any bidder or designer seat: the policy network, its checkpoint
loader and the agent that plays it (the trainer, ``market.train.rl_train``, builds on these).

Spec: ``torch_policy?path=CHECKPOINT`` (greedy: the argmax over the masked logits), or
``torch_policy?path=CHECKPOINT&sample=true`` to sample from the masked softmax with a
``torch.Generator`` seeded from the seat's seed. The agent sees only its seat's observation; it
turns it into the RL view (:func:`market.environment.wrappers.seat_rl_observation`) and plays the
chosen menu entry's native action. torch is an optional extra, imported only when a network is
built or a checkpoint loaded: :data:`PolicyNet` is made on first use (:func:`policy_net_class`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from agents.base import BaseAgent, as_flag
from market.core.actions import ActionModel
from market.environment import (
    MENU,
    MENU_NAMES,
    Observation,
    seat_rl_observation,
    translate,
    vector_size,
)

TORCH_HINT = "needs torch: pip install 'gpumarket[rl]'"
FORMAT = "gpumarket-torch-policy/1"


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or not a gpumarket torch policy."""


def import_torch() -> Any:
    """torch, or a ValueError (the registry reports it as a one-line spec error)."""
    try:
        import torch
    except ImportError:
        raise ValueError(TORCH_HINT) from None
    return torch


@cache
def policy_net_class() -> type[Any]:
    """The policy network class, built once on first use (it subclasses ``torch.nn.Module``)."""
    torch = import_torch()
    nn = torch.nn

    class PolicyNet(nn.Module):  # type: ignore[name-defined,misc]  # torch: a lazy import, Any
        """MLP body (tanh) with a logits head over the menu and a value head."""

        def __init__(self, obs_size: int, n_actions: int, hidden: Sequence[int] = (64, 64)) -> None:
            super().__init__()
            layers: list[Any] = []
            size = obs_size
            for width in hidden:
                # skip_init: no draw from torch's global RNG; init_weights() uses our generator
                layers += [nn.utils.skip_init(nn.Linear, size, width), nn.Tanh()]
                size = width
            self.body = nn.Sequential(*layers)
            self.logits = nn.utils.skip_init(nn.Linear, size, n_actions)
            self.value = nn.utils.skip_init(nn.Linear, size, 1)

        def init_weights(self, generator: Any) -> None:
            """Orthogonal weights (gain sqrt 2 in the body, 0.01 for logits so the start is near
            uniform over the unmasked entries, 1 for the value), zero biases."""
            for module, gain in [
                *((m, math.sqrt(2)) for m in self.body if isinstance(m, nn.Linear)),
                (self.logits, 0.01),
                (self.value, 1.0),
            ]:
                with torch.no_grad():
                    nn.init.orthogonal_(module.weight, gain, generator=generator)
                    module.bias.zero_()

        def forward(self, x: Any) -> tuple[Any, Any]:
            h = self.body(x)
            return self.logits(h), self.value(h).squeeze(-1)

    PolicyNet.__module__ = __name__
    PolicyNet.__qualname__ = "PolicyNet"
    return PolicyNet


def __getattr__(name: str) -> Any:
    """``PolicyNet`` (importable and picklable by name; importing it imports torch)."""
    if name == "PolicyNet":
        return policy_net_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def masked_logits(logits: Any, mask: Any) -> Any:
    """Logits with every masked-out entry (mask 0) set to the dtype's lowest value.

    A masked-out entry then has probability exactly 0 whenever any entry is masked in (its
    ``exp`` underflows), and argmax never picks it. With an all-zero mask every entry is equal.
    """
    import torch

    return torch.where(mask > 0, logits, torch.finfo(logits.dtype).min)


def choose(
    net: Any,
    observation: np.ndarray,
    mask: np.ndarray,
    generator: Any = None,
) -> int:
    """The menu index the policy picks: a sample with ``generator``, else the argmax."""
    import torch

    with torch.no_grad():
        logits, _ = net(torch.as_tensor(observation, dtype=torch.float32))
        logits = masked_logits(logits, torch.as_tensor(mask))
        if generator is None:
            return int(torch.argmax(logits))
        return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))


def load_checkpoint(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """The policy and its metadata; :class:`CheckpointError` (one line) if the file is unusable.

    Loading is weights-only (no pickled code runs). The checkpoint must match this version's
    observation vector and menu, or the policy's inputs and outputs would mean something else.
    """
    torch = import_torch()
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not exist (train one with 'gpumarket train --out DIR')"
        )
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a corrupt or foreign file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"checkpoint {str(path)!r} cannot be read as a torch file: {first[:200]}"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {str(path)!r} is not a gpumarket torch policy (format {FORMAT!r})"
        )
    meta = data["meta"]
    if meta.get("obs_size") != vector_size() or list(meta.get("menu", [])) != list(MENU_NAMES):
        raise CheckpointError(
            f"checkpoint {str(path)!r} was trained for another observation "
            f"vector or menu ({meta.get('obs_size')} inputs, "
            f"{meta.get('menu_size')} actions; this version has "
            f"{vector_size()} and {len(MENU)})"
        )
    net = policy_net_class()(meta["obs_size"], meta["menu_size"], meta["hidden"])
    try:
        net.load_state_dict(data["state_dict"])
    except (RuntimeError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: weights do not fit the policy: "
            f"{str(exc).splitlines()[0][:200]}"
        ) from None
    net.eval()
    return net, meta


class TorchPolicyAgent(BaseAgent):
    """A policy trained with ``gpumarket train`` (torch_policy?path=FILE[&sample=true])."""

    name = "torch_policy"
    roles = frozenset({"bidder", "designer"})

    def __init__(
        self, path: str = "", sample: bool | str = False, max_units_per_bid: int | None = None
    ) -> None:
        super().__init__()
        if not path:
            raise ValueError("give the checkpoint: torch_policy?path=FILE")
        self.torch = import_torch()
        self.net, self.meta = load_checkpoint(path)
        self.path = str(path)
        self.sample = as_flag(sample, "sample")
        # the env's unit-bid cap comes from the scenario, which an agent is not given
        self.max_units_per_bid = int(
            self.meta.get("max_units_per_bid", 0)
            if max_units_per_bid is None
            else max_units_per_bid
        )
        self.generator = self.torch.Generator().manual_seed(0)

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        # a torch seed must fit in 64 bits; the seat seed is derived from the episode's streams
        self.generator = self.torch.Generator().manual_seed(int(seed or 0) % 2**63)

    def menu_index(self, observation: Observation) -> int:
        """The menu entry the policy picks for this observation."""
        rl_obs = seat_rl_observation(observation, self.max_units_per_bid)
        return choose(
            self.net,
            rl_obs["observation"],
            rl_obs["action_mask"],
            self.generator if self.sample else None,
        )

    def act(self, observation: Observation) -> ActionModel:
        return translate(observation, self.menu_index(observation), self.max_units_per_bid)[0]
