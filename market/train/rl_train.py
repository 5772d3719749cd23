"""Train one seat with a plain PyTorch policy gradient (REINFORCE with a learned baseline).

The textbook recipe, on the RL view (:func:`market.environment.wrappers.rl_env`):

* **policy**: a small MLP over the 44-entry observation vector with two heads, logits over
  :data:`~market.environment.wrappers.MENU` and a state value. Masked-out entries get the lowest float as
  logit (:func:`masked_logits`), so they are never sampled nor picked by argmax.
* **episodes**: the learning seat (default ``bidder_0``) acts through the menu; every other seat
  is played by the scenario's scripted population (its ``[agents]`` table, see
  :func:`market.run.rollout.default_seats`), which acts natively. Episode seeds are drawn from a
  ``SeedSequence`` of the training seed, at or above :data:`TRAIN_SEED_FLOOR`, so evaluation
  seeds below it are held out.
* **update**: after every ``batch_episodes`` episodes, for each decision ``t`` the return-to-go
  ``G_t`` (the seat's rewards after it, undiscounted by default) and the advantage
  ``A_t = G_t - V(s_t)``, normalised over the batch. The loss is
  ``-mean(log pi(a_t|s_t) A_t) + value_coef * mean((V(s_t) - G_t)^2) - entropy_coef * mean(H)``,
  one Adam step per batch.

Randomness comes only from a seeded ``torch.Generator`` (weights, sampling) and NumPy
``Generator`` (episode seeds); the global RNGs are never used, so the same config gives the same
learning curve. :func:`save_checkpoint` writes the weights and what is needed to rebuild and check
the policy; :class:`agents.torch_policy.TorchPolicyAgent` (which owns the network, :data:`PolicyNet`, and
:func:`~agents.torch_policy.load_checkpoint`) plays it in any seat
(spec ``torch_policy?path=FILE``). :func:`evaluate` compares it, paired on the same held-out
seeds, with ``random_valid`` and ``rule_expert`` in the same seat.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.registry import make_agent
from agents.torch_policy import (
    FORMAT,
    TorchPolicyAgent,
    choose,
    import_torch,
    masked_logits,
    policy_net_class,
)
from market.core.seats import DESIGNER
from market.environment.observations import vector_size
from market.environment.wrappers import MENU, MENU_NAMES, DiscreteActionWrapper, rl_env
from market.run.rollout import default_seats, mean_ci95, run_episode
from scenarios import load_scenario

TRAIN_SEED_FLOOR = 2**20  # training episode seeds are >= this; evaluation seeds below are unseen
SEED_CEILING = 2**31 - 1
EVAL_SEEDS = tuple(range(30))


@dataclass
class TrainConfig:
    """What to train and for how long; training stops at whichever budget is reached first
    (3000 episodes when neither is given)."""

    scenario: str = "market_round"
    seat: str = "bidder_0"
    episodes: int | None = None
    seconds: float | None = None
    seed: int = 0
    batch_episodes: int = 16
    lr: float = 3e-3
    hidden: tuple[int, ...] = (64, 64)
    gamma: float = 1.0
    entropy_coef: float = 0.01
    value_coef: float = 0.5

    def __post_init__(self) -> None:
        if self.episodes is None and self.seconds is None:
            self.episodes = 3000
        if self.episodes is not None and self.episodes < 1:
            raise ValueError(f"episodes must be at least 1, got {self.episodes}")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"seconds must be above 0, got {self.seconds}")
        if self.batch_episodes < 1:
            raise ValueError(f"batch_episodes must be at least 1, got {self.batch_episodes}")
        self.hidden = tuple(int(h) for h in self.hidden)


@dataclass
class TrainResult:
    net: Any  # agents.torch_policy.PolicyNet
    config: TrainConfig
    curve: list[dict[str, float]] = field(default_factory=list)  # one point per update
    episodes: int = 0
    seconds: float = 0.0
    interrupted: bool = False  # stopped by Ctrl-C after a finished update (the net is usable)

    def meta(self) -> dict[str, Any]:
        """Checkpoint metadata: what the policy was trained on and how to rebuild it."""
        sc = load_scenario(self.config.scenario)
        return {
            "format": FORMAT,
            "scenario": sc.name,
            "seat": self.config.seat,
            "obs_size": vector_size(),
            "menu_size": len(MENU),
            "menu": list(MENU_NAMES),
            "hidden": list(self.config.hidden),
            "max_units_per_bid": sc.capacity.max_units_per_bid,
            "episodes": self.episodes,
            "seconds": round(self.seconds, 3),
            "config": asdict(self.config),
        }

    def curve_json(self) -> dict[str, Any]:
        return {
            "scenario": self.config.scenario,
            "seat": self.config.seat,
            "seed": self.config.seed,
            "batch_episodes": self.config.batch_episodes,
            "episodes": self.episodes,
            "seconds": round(self.seconds, 3),
            "points": self.curve,
        }


@dataclass
class _Trajectory:
    observations: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # reward that followed each decision
    total: float = 0.0  # the seat's episode return (including reward before its first decision)


class Trainer:
    """Plays episodes with the learning seat and the scripted population, and updates the net."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.env: DiscreteActionWrapper = rl_env(config.scenario)
        raw = self.env.unwrapped
        if config.seat not in raw.possible_agents:
            raise ValueError(
                f"seat {config.seat!r} is not in scenario {config.scenario!r}; "
                f"seats: {', '.join(raw.possible_agents)}"
            )
        specs = default_seats(raw.scenario)
        self.population = {
            s: make_agent(spec, "designer" if s == DESIGNER else "bidder")
            for s, spec in specs.items()
            if s != config.seat
        }
        torch = import_torch()  # an optional extra: a ValueError with the install hint
        self.torch_gen = torch.Generator().manual_seed(config.seed)
        self.seed_rng = np.random.default_rng(np.random.SeedSequence([config.seed, 1]))
        self.net = policy_net_class()(vector_size(), len(MENU), config.hidden)
        self.net.init_weights(self.torch_gen)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=config.lr)

    def play(self, seed: int, pick: Callable[[np.ndarray, np.ndarray], int]) -> _Trajectory:
        """One episode; ``pick(observation, mask)`` chooses the learning seat's menu entries."""
        env, raw, seat = self.env, self.env.unwrapped, self.config.seat
        env.reset(seed=seed)
        for s, agent in self.population.items():
            agent.reset(raw.seat_seed(s))
        traj = _Trajectory()
        for agent in env.agent_iter():
            if agent != seat:
                _, _, term, trunc, _ = env.last(observe=False)
                env.step(None if term or trunc else self.population[agent].act(raw.observe(agent)))
                continue
            obs, reward, term, trunc, _ = env.last()
            traj.total += reward
            if traj.rewards:
                traj.rewards[-1] += reward
            if term or trunc:
                env.step(None)
                continue
            index = pick(obs["observation"], obs["action_mask"])
            traj.observations.append(obs["observation"])
            traj.masks.append(obs["action_mask"])
            traj.actions.append(index)
            traj.rewards.append(0.0)
            env.step(index)
        return traj

    def _returns_to_go(self, rewards: list[float]) -> list[float]:
        out, g = [], 0.0
        for r in reversed(rewards):
            g = r + self.config.gamma * g
            out.append(g)
        return out[::-1]

    def update(self, batch: list[_Trajectory]) -> None:
        """One policy-gradient step on a batch of episodes (see the module docstring)."""
        import torch

        steps = [t for t in batch if t.actions]
        if not steps:
            return
        obs = torch.as_tensor(np.stack([o for t in steps for o in t.observations]))
        mask = torch.as_tensor(np.stack([m for t in steps for m in t.masks]))
        actions = torch.as_tensor([a for t in steps for a in t.actions])
        returns = torch.as_tensor(
            [g for t in steps for g in self._returns_to_go(t.rewards)], dtype=torch.float32
        )
        logits, values = self.net(obs)
        logp_all = torch.log_softmax(masked_logits(logits, mask), -1)
        logp = logp_all.gather(1, actions[:, None]).squeeze(1)
        probs = logp_all.exp()
        # entropy over the masked-in entries only (masked entries have p = 0 and contribute 0)
        entropy = -(probs * torch.where(probs > 0, logp_all, 0.0)).sum(-1)
        adv = returns - values.detach()
        if len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        loss = (
            -(logp * adv).mean()
            + self.config.value_coef * ((values - returns) ** 2).mean()
            - self.config.entropy_coef * entropy.mean()
        )
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def train(self, progress: Callable[[dict[str, float]], None] | None = None) -> TrainResult:
        """Train until the episode or time budget is spent (checked after each update).

        Ctrl-C stops after the batch in flight is played and applied, never inside an update,
        so the result (``interrupted=True``) holds a usable policy; a second Ctrl-C aborts."""
        cfg = self.config
        result = TrainResult(self.net, cfg)
        start = time.perf_counter()

        def sample(observation: np.ndarray, mask: np.ndarray) -> int:
            return choose(self.net, observation, mask, self.torch_gen)

        with _stop_on_sigint() as stop:
            self._loop(result, start, sample, progress, stop)
        result.interrupted = bool(stop)
        self.net.eval()
        return result

    def _loop(
        self,
        result: TrainResult,
        start: float,
        sample: Callable[[np.ndarray, np.ndarray], int],
        progress: Callable[[dict[str, float]], None] | None,
        stop: list[bool],
    ) -> None:
        cfg = self.config
        while not stop:
            n = cfg.batch_episodes
            if cfg.episodes is not None:
                n = min(n, cfg.episodes - result.episodes)
            seeds = self.seed_rng.integers(TRAIN_SEED_FLOOR, SEED_CEILING, size=n)
            batch = [self.play(int(s), sample) for s in seeds]
            self.update(batch)
            result.episodes += n
            result.seconds = time.perf_counter() - start
            point = {
                "episodes": result.episodes,
                "seconds": round(result.seconds, 3),
                "mean_return": float(np.mean([t.total for t in batch])),
            }
            result.curve.append(point)
            if progress is not None:
                progress(point)
            if cfg.episodes is not None and result.episodes >= cfg.episodes:
                break
            if cfg.seconds is not None and result.seconds >= cfg.seconds:
                break


@contextlib.contextmanager
def _stop_on_sigint() -> Iterator[list[bool]]:
    """Turn the first Ctrl-C into a request to stop (a non-empty list); the second raises."""
    stop: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signals only reach the main thread
        return

    def request(signum: int, frame: Any) -> None:
        if stop:
            raise KeyboardInterrupt
        stop.append(True)

    previous = signal.signal(signal.SIGINT, request)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def train(
    config: TrainConfig, progress: Callable[[dict[str, float]], None] | None = None
) -> TrainResult:
    """Train a policy for ``config.seat`` against the scenario's scripted population."""
    return Trainer(config).train(progress)


# --- checkpoints ---------------------------------------------------------------------------
def save_checkpoint(result: TrainResult, path: str | Path) -> Path:
    """Write ``{"format", "meta", "state_dict"}`` with ``torch.save`` (loadable weights-only)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"format": FORMAT, "meta": result.meta(), "state_dict": result.net.state_dict()}, path
    )
    return path


# --- evaluation ----------------------------------------------------------------------------
def seat_returns(scenario: str, seat: str, agent: Any, seeds: Iterable[int]) -> list[float]:
    """``seat``'s return per seed with ``agent`` (spec or agent object) in it, others default."""
    return [run_episode(scenario, int(s), seats={seat: agent}).returns[seat] for s in seeds]


def evaluate(
    checkpoint: str | Path,
    scenario: str | None = None,
    seat: str | None = None,
    seeds: Sequence[int] = EVAL_SEEDS,
    baselines: Sequence[str] = ("random_valid", "rule_expert"),
) -> dict[str, Any]:
    """Paired comparison on the same seeds: the greedy policy vs each baseline in its seat.

    For each baseline: both means and the mean of the per-seed differences (policy − baseline),
    each with its 95% CI half-width (:func:`market.run.rollout.mean_ci95`).
    """
    agent = TorchPolicyAgent(path=str(checkpoint))
    scenario = scenario or agent.meta["scenario"]
    seat = seat or agent.meta["seat"]
    mine = seat_returns(scenario, seat, agent, seeds)
    out: dict[str, Any] = {
        "scenario": scenario,
        "seat": seat,
        "seeds": list(seeds),
        "policy": dict(zip(("mean", "ci95"), mean_ci95(mine), strict=True)),
        "policy_returns": mine,
        "baselines": {},
    }
    for spec in baselines:
        theirs = seat_returns(scenario, seat, spec, seeds)
        diff = [a - b for a, b in zip(mine, theirs, strict=True)]
        out["baselines"][spec] = {
            "mean": mean_ci95(theirs)[0],
            "ci95": mean_ci95(theirs)[1],
            "diff_mean": mean_ci95(diff)[0],
            "diff_ci95": mean_ci95(diff)[1],
            "returns": theirs,
        }
    return out


def format_evaluation(report: dict[str, Any]) -> str:
    """A small text table of :func:`evaluate`'s report."""
    pol = report["policy"]
    lines = [
        f"{report['scenario']} {report['seat']}, {len(report['seeds'])} held-out seeds "
        "(mean return ± 95% CI; diff = policy − baseline, paired by seed)",
        f"  {'torch policy':<14} {pol['mean']:8.3f} ± {pol['ci95']:.3f}",
    ]
    for spec, row in report["baselines"].items():
        lines.append(
            f"  {spec:<14} {row['mean']:8.3f} ± {row['ci95']:.3f}   "
            f"diff {row['diff_mean']:+.3f} ± {row['diff_ci95']:.3f}"
        )
    return "\n".join(lines)


def write_curve(result: TrainResult, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.curve_json(), indent=1))
    return path
