"""A seat trained by ``train-llm`` is sent the prompts it learnt from: the SFT/GRPO records render
the teacher's decisions at the prompt budget of the LLM seat the evaluation builds (its
``context`` and ``max_tokens``). Before, the records were rendered at a 2,048-token context while
the ``llm:hf`` seat used 8,192 tokens: the DAEDALUS designer's prompt was cut in training and
whole at evaluation, and the distilled designer answered ``wait`` to every unfamiliar prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.llm.agent import LLMAgent
from agents.llm.backends.base import Completion
from agents.llm.prompts import prompt_budget, prompt_messages
from market.run.runner import run_scenario
from market.train.llm_config import load_config
from market.train.llm_train import data_filter, llm_spec, seat_budget
from market.train.replayer import Replayer, load_transcript, transcript_files
from market.train.training_data import select_decisions

ROOT = Path(__file__).resolve().parents[2]


class Recording:
    """A backend that records what the seat sends and waits."""

    model = "recording"

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def complete(self, messages: Any, schema: Any, params: Any) -> Completion:
        self.sent.append(messages)
        return Completion(text='{"action_type": "wait"}', model=self.model)


def test_the_designers_training_prompts_are_the_prompts_its_seat_is_sent(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "docs" / "training" / "designer_sft.toml")
    spec = llm_spec(cfg, "cpu")
    assert f"&context={cfg.eval.context}&" in spec + "&"
    assert f"&max_tokens={cfg.eval.max_tokens}&" in spec + "&"
    flt = data_filter(cfg)
    assert flt.max_prompt_tokens == seat_budget(cfg)
    assert seat_budget(cfg) == prompt_budget(cfg.eval.context, cfg.eval.max_tokens)

    folder = tmp_path / "teacher"
    run_scenario("daedalus_stage_0", [0], {"designer_0": "rule_designer"}, folder, progress=False)
    records = list(select_decisions([folder], flt))
    assert [r["metadata"]["round"] for r in records] == [0, 5, 10, 15, 20]

    t = load_transcript(transcript_files([folder])[0])
    replayer = Replayer(t)
    cut_somewhere = 0
    for record in records:
        while replayer.next < record["metadata"]["step"]:
            replayer.advance()
        _, obs, _ = replayer.observe()
        backend = Recording()
        seat = LLMAgent(
            backend,  # type: ignore[arg-type]
            memory="none",
            context=cfg.eval.context,
            max_tokens=cfg.eval.max_tokens,
        )
        seat.act(obs)
        assert backend.sent[0] == record["messages"][:-1]  # the very prompt trained on
        whole = prompt_messages(obs, max_tokens=None)
        cut_somewhere += whole != record["messages"][:-1]
    # the budget matters here: the designer's prompts with market health are cut to fit it
    assert cut_somewhere >= 1
