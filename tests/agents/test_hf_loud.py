"""The loud local backend (issue 33): a model without a chat template is a recorded degradation,
``threads=`` sets torch's CPU threads (default: one share of the cores per CPU model loaded), and
an ``llm:hf`` seat on the CPU gets a decision time limit that fits a CPU decision unless the run
sets one. Real tokenizer (SmolLM2-135M's, from the test GGUF) on a tiny random Llama."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from real_model_utils import (
    HF_INSTALL,
    HF_MODULES,
    require_modules,
    tiny_smollm_folder,
)

from agents.registry import AgentSpecError, make_agent

pytestmark = pytest.mark.real_model
MESSAGES = [
    {"role": "system", "content": "You bid for GPUs."},
    {"role": "user", "content": "Reply with JSON."},
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny random Llamas on SmolLM2's tokenizer: one with its chat template, one without."""
    require_modules(HF_MODULES, HF_INSTALL)
    return {
        name: tiny_smollm_folder(tmp_path_factory.mktemp(name), chat_template=name == "template")
        for name in ("template", "plain")
    }


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Restore torch's CPU threads and forget the counted models after the test."""
    import torch

    from agents.llm.backends.hf_threads import forget_models

    before = torch.get_num_threads()
    forget_models()
    yield
    forget_models()
    torch.set_num_threads(before)


def test_a_model_without_a_chat_template_says_so_in_every_reply(folders: dict[str, Path]) -> None:
    from agents.llm.backends.hf_backend import NO_TEMPLATE, HFBackend

    plain = HFBackend(folders["plain"], max_new_tokens=3, share_model=False)
    reply = plain.complete(MESSAGES, None, {})
    assert NO_TEMPLATE in reply.extra["degraded"]
    assert reply.extra["finish_reason"] in ("length", "stop")
    templated = HFBackend(folders["template"], max_new_tokens=3, share_model=False)
    assert NO_TEMPLATE not in templated.complete(MESSAGES, None, {}).extra.get("degraded", [])


def test_an_llm_seat_on_a_model_without_a_template_counts_every_decision_degraded(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    from agents.llm.backends.hf_backend import NO_TEMPLATE
    from market.record.transcript import read_transcript
    from market.run.health import from_rows
    from market.run.rollout import run_episode
    from market.run.runner import episode_rows

    spec = f"llm:hf?path={folders['plain']}&max_tokens=24&retries=0&memory=none"
    path = tmp_path / "t.jsonl"
    result = run_episode("single_trade", 0, {"bidder_0": spec}, transcript=path)
    decisions = result.decisions["bidder_0"]
    (row,) = [r for r in episode_rows(result, "c") if r["seat"] == "bidder_0"]
    assert decisions >= 1 and row["degraded"] == decisions
    requests = int(row["stats"]["requests"])
    (seat,) = [h for h in from_rows([row]) if h.seat == "bidder_0"]
    assert seat.degraded == decisions and seat.troubled
    extras = [
        e.llm.model_extra or {}
        for e in read_transcript(path).steps
        if e.seat == "bidder_0" and e.llm is not None
    ]
    assert all(NO_TEMPLATE in x["degraded"] for x in extras)
    reasons = [r for x in extras for r in x["finish_reasons"]]
    assert len(reasons) == requests and set(reasons) <= {"length", "stop"}
    assert row["cutoffs"] == reasons.count("length")


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", True])
def test_threads_is_a_whole_number_of_at_least_one(value: Any, folders: dict[str, Path]) -> None:
    from agents.llm.backends.hf_backend import HFBackend

    with pytest.raises(ValueError, match=r"give a whole number of CPU threads, at least 1"):
        HFBackend(folders["template"], threads=value)


def test_a_bad_threads_spec_is_one_clear_line(folders: dict[str, Path]) -> None:
    for bad in ("0", "few"):
        with pytest.raises(AgentSpecError) as info:
            make_agent(f"llm:hf?path={folders['template']}&threads={bad}")
        assert str(info.value) == (
            f"llm:hf: threads={bad}: give a whole number of CPU threads, at least 1"
        )


def test_threads_sets_torchs_threads_at_load(folders: dict[str, Path], torch_threads: None) -> None:
    import torch

    from agents.llm.backends.hf_backend import HFBackend

    one = HFBackend(folders["template"], threads="1", max_new_tokens=2, share_model=False)
    assert one.threads == 1 and one.cpu_threads is None  # nothing set before the load
    reply = one.complete(MESSAGES, None, {})
    assert torch.get_num_threads() == 1 == one.cpu_threads == reply.extra["threads"]


def test_the_default_gives_each_cpu_model_a_share_of_the_cores(
    folders: dict[str, Path], torch_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from agents.llm.backends.hf_backend import HFBackend
    from agents.llm.backends.hf_threads import OMP_ENV, share, usable_cores

    assert share(1, cores=16) == 8 and share(2, cores=16) == 5 and share(1, cores=2) == 1
    assert share(3, cores=1) == 1
    monkeypatch.delenv(OMP_ENV, raising=False)
    cores = usable_cores()
    torch.set_num_threads(cores + 1)  # neither share: the load must set it
    first = HFBackend(folders["template"], share_model=False).load()
    assert first.cpu_threads == max(1, cores // 2) == torch.get_num_threads()
    second = HFBackend(folders["plain"], share_model=False).load()
    assert second.cpu_threads == max(1, cores // 3) == torch.get_num_threads()
    # OMP_NUM_THREADS set by the user: the default leaves torch alone
    monkeypatch.setenv(OMP_ENV, "3")
    torch.set_num_threads(3)
    third = HFBackend(folders["template"], share_model=False).load()
    assert third.cpu_threads == 3 == torch.get_num_threads()


def test_an_llm_hf_seat_on_the_cpu_gets_the_cpu_decision_limit_unless_the_run_sets_one(
    folders: dict[str, Path],
) -> None:
    from agents.llm.backends.hf_backend import CPU_DECISION_TIMEOUT_S
    from market.environment.aec import raw_env
    from market.run.deadlines import with_agent_timeout
    from market.run.rollout import Episode
    from scenarios import load_scenario

    spec = f"llm:hf?path={folders['template']}"
    scenario = load_scenario("single_trade")
    default = scenario.agent_timeout
    assert default < CPU_DECISION_TIMEOUT_S

    def limits(sc: Any, agent_timeout: float | None = None, seat: str = spec) -> dict[str, Any]:
        ep = Episode(raw_env(sc), 0, {"bidder_0": seat}, None, 1, agent_timeout=agent_timeout)
        return {s: ep.deadline.limit_of(s) for s in ep.agents}

    got = limits(scenario)
    assert got["bidder_0"] == CPU_DECISION_TIMEOUT_S
    assert all(v == default for s, v in got.items() if s != "bidder_0")
    # a limit the user set applies to every seat: --agent-timeout, or the scenario file's
    assert set(limits(scenario, 30.0).values()) == {30.0}
    assert set(limits(with_agent_timeout(scenario, 45.0)).values()) == {45.0}
    assert set(limits(scenario, 0.0).values()) == {None}
    # a model on another device keeps the run's limit
    assert limits(scenario, seat=f"{spec}&device=cuda")["bidder_0"] == default
