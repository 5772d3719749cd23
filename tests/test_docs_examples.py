"""Every ```python example in docs/*.md runs, and the agents it defines play without invalid
actions.

A page's examples run in order in one namespace and one temporary working directory, so an
example may use what an earlier one on the same page defined (``env``, ``sc``, a run folder).
Some examples are fragments of a session the page describes in prose (``env.last()`` in the
middle of an episode): :data:`SETUP` builds that session first. Examples that train models or
talk to an LLM server run against local stand-ins, by the textual substitutions in
:data:`SUBSTITUTE` (a scaled-down budget, a tiny model, the fake OpenAI server); each
substitution must match the page, so an edited example cannot slip past its test.

Every env stepped in this process is watched, and every episode result an example keeps is
read: an action the env rejects fails the page, except on the one page that shows a rejected
action on purpose (:data:`EXPECTED_ERRORS`) and for seats played by the built-in population
(``random_valid`` and ``always_accept`` blunder by design; they are tested elsewhere).
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

import market.environment.aec
from agents.registry import REGISTRY
from market.run.rollout import EpisodeResult

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Example:
    page: str
    number: int  # 1-based, in page order
    line: int
    code: str


def examples(page: str) -> list[Example]:
    text = (DOCS / page).read_text(encoding="utf-8")
    return [
        Example(page, k, text.count("\n", 0, m.start()) + 2, m.group(1))
        for k, m in enumerate(FENCE.finditer(text), 1)
    ]


def pages() -> list[str]:
    return sorted(p.name for p in DOCS.glob("*.md") if examples(p.name))


# a market_round session that has reached bidder_0's bidding turn, every seat truthful
_TO_BIDDING = """
import market
from agents.registry import make_agent

env = market.env("market_round")
env.reset(seed=0)
policy = {a: make_agent("fixed" if a == "designer_0" else "truthful") for a in env.possible_agents}
for a, agent in policy.items():
    agent.reset(seed=env.unwrapped.seat_seed(a))
for agent in env.agent_iter():
    obs, reward, term, trunc, info = env.last()
    if agent == "bidder_0" and obs.phase == "bidding" and {STOP}:
        break
    env.step(None if term or trunc else policy[agent].act(obs))
"""

SETUP: dict[str, str] = {
    # the protocol's annotations, as the page names them
    "agents.md": """
from typing import Protocol
from market.core.actions import Action
from market.environment.observations import Observation
""",
    # "Example:" of a rejected bid: bidder_0 is to bid
    "actions.md": _TO_BIDDING.replace("{STOP}", "True"),
    # env.last() at bidder_0's turn after a clearing step (round 1's bidding)
    "rewards.md": _TO_BIDDING.replace("{STOP}", "obs.round == 1"),
    # the loop of the page, with an env and a policy per seat
    "turn-order.md": _TO_BIDDING.replace("{STOP}", "False").split("for agent in")[0],
    # the audit after a whole episode
    "world.md": _TO_BIDDING.replace("{STOP}", "False"),
    # load_scenario("path/to/mine.toml") needs the file; the page imports market in its prose
    "scenarios.md": """
import market
from pathlib import Path
Path("path/to").mkdir(parents=True)
Path("path/to/mine.toml").write_text('extends = "market_round"\\nrounds = 3\\n')
""",
    # the run folder the export examples read: two recorded market_round episodes, bidder_0
    # an LLM seat (on the fake server) whose prompts GRPO trains on
    "training-data.md": """
from market.run.runner import run_scenario
run_scenario("market_round", range(2), {"bidder_0": LLM_SPEC}, "runs/market_round",
             workers=1, progress=False)
""",
}

SUBSTITUTE: dict[tuple[str, int], list[tuple[str, str]]] = {
    # 200 episodes of two LLM seats: 4 are enough to show the pool and the budget at work
    ("llm-seats.md", 2): [
        ("http://127.0.0.1:8000/v1", "{FAKE_URL}"),
        ("range(200)", "range(4)"),
        ('range(8), {"bidder_0": spec}', 'range(2), {"bidder_0": spec}'),
    ],
    # 5000 training episodes take minutes: 64 show the pipeline, checkpoint and evaluation
    ("rl.md", 3): [("episodes=5000", "episodes=64"), ("seeds=range(30)", "seeds=range(4)")],
    # RLlib: one PPO iteration on small batches instead of five
    ("rl.md", 2): [
        ("range(5)", "range(1)"),
        (
            "train_batch_size_per_learner=2000, minibatch_size=250",
            "train_batch_size_per_learner=200, minibatch_size=100",
        ),
    ],
    # GRPO: a tiny local model (no download), one step instead of a whole epoch, on the CPU
    ("training-data.md", 2): [
        (
            'model="Qwen/Qwen2.5-0.5B-Instruct",   # any chat model with a chat template',
            "model=TINY_MODEL, processing_class=TINY_TOKENIZER,",
        ),
        (
            'report_to="none",',
            'report_to="none", max_steps=1, use_cpu=True, bf16=False, save_strategy="no",',
        ),
        ("num_generations=8,", "num_generations=2,"),
        ("per_device_train_batch_size=8,", "per_device_train_batch_size=2,"),
        ("max_completion_length=256,", "max_completion_length=8,"),
    ],
    # GRPO through the OpenEnv server: the same tiny model, one step, two prompts
    ("openenv.md", 3): [
        ('"bidder_0", range(64)', '"bidder_0", range(2)'),
        (
            'model="Qwen/Qwen2.5-0.5B-Instruct",  # any chat model with a chat template',
            "model=TINY_MODEL, processing_class=TINY_TOKENIZER,",
        ),
        (
            'report_to="none",',
            'report_to="none", max_steps=1, use_cpu=True, bf16=False, save_strategy="no",',
        ),
        ("num_generations=8,", "num_generations=2,"),
        ("per_device_train_batch_size=8,", "per_device_train_batch_size=2,"),
        ("max_completion_length=256,", "max_completion_length=8,"),
    ],
}

#: pages that show a rejected action on purpose, and the error text they show
EXPECTED_ERRORS: dict[str, str] = {
    "actions.md": "invalid bid: bid.bids: Value error, bid 1 (5.0) is above bid 0 (3.0)",
    "observations.md": "offer 'o9' does not exist; use an offer_id from offers_received",
}
#: examples in which a policy learns by trial under the RL action mask: what the env rejects
#: there is exploration, not the example's play (the mask still lets a few offers of already
#: committed blocks, and one RLlib designer step, through)
LEARNING = {("rl.md", 2), ("rl.md", 3)}
#: pages whose examples take minutes (training) or need the optional extras
SLOW = {"rl.md", "training-data.md", "openenv.md"}


def code_of(ex: Example, values: dict[str, str]) -> str:
    code = ex.code
    for old, new in SUBSTITUTE.get((ex.page, ex.number), []):
        assert old in code, f"{ex.page} example {ex.number} (line {ex.line}) no longer has {old!r}"
        for key, value in values.items():
            new = new.replace("{" + key + "}", value)
        code = code.replace(old, new)
    return code


@pytest.fixture
def rejected(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every action an env in this process rejects, as 'seat: error'."""
    seen: list[str] = []
    step = market.environment.aec.raw_env.step

    def watched(self: Any, action: Any) -> None:
        seat = self.agent_selection
        step(self, action)
        error = (self.infos.get(seat) or {}).get("error") if action is not None else None
        if error:
            seen.append(f"{seat}: {error}")

    monkeypatch.setattr(market.environment.aec.raw_env, "step", watched)
    yield seen


def _plug_in(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """agents.md's plug-in, installed as its entry point says (``reserve_sniper``)."""
    import agents.registry

    monkeypatch.syspath_prepend(str(folder))
    point = EntryPoint("reserve_sniper", "my_agents.snipers:ReserveSniper", "gpumarket.agents")
    monkeypatch.setattr(agents.registry, "plugins", lambda: {"reserve_sniper": point})


@pytest.mark.parametrize(
    "page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p for p in pages()]
)
def test_docs_examples_run(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rejected: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    values: dict[str, str] = {}
    namespace: dict[str, Any] = {"__name__": f"docs_{page[:-3].replace('-', '_')}"}
    with _stand_ins(page, namespace, values, monkeypatch, tmp_path):
        if page in SETUP:
            exec(compile(textwrap.dedent(SETUP[page]), f"<setup of {page}>", "exec"), namespace)
        for ex in examples(page):
            code = code_of(ex, values)
            if ex.code.startswith("# my_agents/"):  # a module of the reader's own package
                path = tmp_path / ex.code.splitlines()[0][2:].strip()
                path.parent.mkdir(parents=True, exist_ok=True)
                (path.parent / "__init__.py").touch()
                path.write_text(code, encoding="utf-8")
                _plug_in(monkeypatch, tmp_path)
            before = len(rejected)
            try:
                exec(compile(code, f"{page}:{ex.line}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(
                    f"{page} example {ex.number} (line {ex.line}) raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if (page, ex.number) in LEARNING:
                del rejected[before:]
    results = [
        r
        for v in namespace.values()
        for r in (v if isinstance(v, list) else [v])
        if isinstance(r, EpisodeResult)
    ]
    # the built-in population is tested elsewhere (random_valid and always_accept blunder by
    # design); here the agents the page itself defines or configures must play validly
    builtin = {s for r in results for s, spec in r.seats.items() if spec in REGISTRY}
    mine = [e for e in rejected if e.split(":", 1)[0] not in builtin]
    expected = EXPECTED_ERRORS.get(page)
    if expected is None:
        assert mine == [], f"{page}: the examples made invalid actions: {mine[:5]}"
    else:
        assert len(mine) == 1 and expected in mine[0], mine
    for result in results:  # episodes the examples played, in worker processes too
        bad = {s: n for s, n in result.invalid_actions.items() if n and s not in builtin}
        assert not bad, f"{page}: invalid actions in seed {result.seed}: {bad}"


class _stand_ins:
    """What a page's examples need besides the package: the fake OpenAI server for LLM pages,
    a tiny model for GRPO, the plug-in for agents.md's evaluation."""

    def __init__(
        self,
        page: str,
        namespace: dict[str, Any],
        values: dict[str, str],
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
    ) -> None:
        self.page, self.ns, self.values, self.mp, self.tmp = (
            page,
            namespace,
            values,
            monkeypatch,
            tmp_path,
        )
        self.server: Any = None

    def __enter__(self) -> _stand_ins:
        if self.page in ("llm-seats.md", "training-data.md"):
            from market.bench.fake_openai_server import FakeOpenAIServer

            self.server = FakeOpenAIServer().start()
            self.values["FAKE_URL"] = self.server.base_url
            self.mp.setenv("OPENAI_BASE_URL", self.server.base_url)  # OpenAIBackend's default
            self.ns["LLM_SPEC"] = f"llm:openai?model=fake&base_url={self.server.base_url}"
        if self.page in ("training-data.md", "openenv.md"):
            sys.path.insert(0, str(ROOT / "tests" / "train"))  # where test_grpo.py lives
            try:
                from test_grpo import tiny_model, tiny_tokenizer
            finally:
                sys.path.remove(str(ROOT / "tests" / "train"))
            tok = tiny_tokenizer(["wait bid", '{"action_type": "wait"}'])
            self.ns["TINY_TOKENIZER"], self.ns["TINY_MODEL"] = tok, tiny_model(tok)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.stop()
