"""The PettingZoo environment over the core: ``raw_env``/``env`` (AEC), ``parallel_env``, the
observation models agents read, and the RL view (menu, masks) that RL agents and trainers use.

Agents import from here only (never the submodules): ``from market.environment import Observation``.
"""

import importlib
from typing import TYPE_CHECKING

from market.core.trust import (
    QUOTE_PREFIX,
    UNTRUSTED_RULE,
    clean_untrusted,
    is_quoted_line,
    quote_untrusted,
)
from market.environment.observations import (
    CoalitionView,
    ContractView,
    DeliveryView,
    DesignerStats,
    JobView,
    LastActionView,
    MarketResultView,
    MechanismView,
    MessageView,
    Observation,
    OfferView,
    PitchView,
    ShockView,
    affordable,
    can_complete,
    marginal_values,
    vector_size,
)
from market.environment.seat_guide import (
    ActionChoice,
    Choice,
    FieldChoice,
    describe,
    sections,
    story,
    valid_actions,
    verdict,
)

if TYPE_CHECKING:
    from market.environment.aec import env, raw_env
    from market.environment.parallel import ParallelMarketEnv, parallel_env
    from market.environment.wrappers import (
        MENU,
        MENU_NAMES,
        rl_env,
        rl_parallel_env,
        seat_rl_observation,
        translate,
    )

#: the names that need PettingZoo and Gymnasium, imported on first use, so that an agent that
#: imports only the observation models does not load them
_LAZY = {
    "env": "aec",
    "raw_env": "aec",
    "ParallelMarketEnv": "parallel",
    "parallel_env": "parallel",
    "MENU": "wrappers",
    "MENU_NAMES": "wrappers",
    "rl_env": "wrappers",
    "rl_parallel_env": "wrappers",
    "seat_rl_observation": "wrappers",
    "translate": "wrappers",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"market.environment.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'market.environment' has no attribute {name!r}")


__all__ = [
    "MENU",
    "ActionChoice",
    "Choice",
    "FieldChoice",
    "LastActionView",
    "describe",
    "sections",
    "story",
    "valid_actions",
    "verdict",
    "MENU_NAMES",
    "QUOTE_PREFIX",
    "UNTRUSTED_RULE",
    "CoalitionView",
    "ContractView",
    "DeliveryView",
    "DesignerStats",
    "JobView",
    "MarketResultView",
    "MechanismView",
    "MessageView",
    "Observation",
    "OfferView",
    "ParallelMarketEnv",
    "PitchView",
    "ShockView",
    "UNTRUSTED_RULE",
    "affordable",
    "can_complete",
    "clean_untrusted",
    "env",
    "is_quoted_line",
    "marginal_values",
    "parallel_env",
    "quote_untrusted",
    "raw_env",
    "rl_env",
    "rl_parallel_env",
    "seat_rl_observation",
    "translate",
    "UNTRUSTED_RULE",
    "vector_size",
]
