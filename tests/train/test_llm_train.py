"""``gpumarket train-llm`` end to end on CPU with real TRL and PEFT, nothing downloaded: a tiny
random Llama with SmolLM2-135M's tokenizer (read from the GGUF the real-model tests use) as the
base model. SFT on rule_expert's decisions in single_trade: the loss goes down, the adapter is
written, loads as an ``llm:hf?...&adapter=`` seat, and the held-out evaluation plays episodes
with it through the normal runner; one GRPO step from the SFT adapter with the env reward. Bad
configs are one line per problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_model_utils import (
    HF_INSTALL,
    HF_MODULES,
    require_modules,
    tiny_smollm_folder,
)

pytestmark = pytest.mark.real_model


def tiny_base(folder: Path) -> Path:
    """A random 2-layer Llama on SmolLM2's tokenizer (and chat template), saved in ``folder``."""
    return tiny_smollm_folder(folder)


CONFIG = """
[model]
base = "{base}"
device = "cpu"
[seat]
scenarios = ["single_trade"]
[data]
seeds = "0:2"
phases = ["bidding"]
workers = 1
[lora]
r = 8
alpha = 16
dropout = 0.0
[sft]
steps = 8
batch_size = 1
learning_rate = 5e-2
save_steps = 4
[grpo]
init = "{sft}"
steps = 1
batch_size = 2
num_generations = 2
max_completion_length = 8
[eval]
seeds = "100:102"
baselines = ["truthful"]
max_tokens = 40
retries = 0
max_in_flight = 4
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    require_modules((*HF_MODULES, "trl", "peft", "datasets"), f"{HF_INSTALL} peft trl datasets")
    from market.train.llm_train import run_stage

    root = tmp_path_factory.mktemp("train_llm")
    base = tiny_base(root / "base")
    config = root / "tiny.toml"
    config.write_text(CONFIG.format(base=base, sft=root / "sft"), encoding="utf-8")
    run = run_stage("sft", config, root / "sft", say=lambda _: None)
    return config, run


def test_sft_loss_goes_down_and_the_run_folder_is_complete(trained: tuple[Path, Path]) -> None:
    from market.train.llm_train import read_log

    _, run = trained
    losses = [r["loss"] for r in read_log(run) if "loss" in r]
    assert len(losses) == 8
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    for name in ("config.toml", "config.json", "sft.jsonl", "log.jsonl", "eval.json", "eval.md"):
        assert (run / name).is_file(), name
    assert (run / "adapter" / "adapter_config.json").is_file()
    assert (run / "data" / "single_trade" / "results.jsonl").is_file()
    first = json.loads((run / "sft.jsonl").read_text().splitlines()[0])
    assert first["metadata"]["agent"] == "rule_expert" and first["metadata"]["seat"] == "bidder_0"


def test_the_adapter_plays_the_seat_in_the_held_out_evaluation(
    trained: tuple[Path, Path],
) -> None:
    _, run = trained
    report = json.loads((run / "eval.json").read_text())
    body = report["scenarios"]["single_trade"]
    assert set(body["contenders"]) == {"base", run.name, "truthful"}
    mine = body["contenders"][run.name]
    assert "adapter=" in mine["spec"] and mine["episodes"] == 2 and mine["failed"] == 0
    assert mine["decisions"] >= 2 and 0.0 <= mine["valid_action_rate"] <= 1.0
    pairs = {(p["a"], p["b"]) for p in body["paired"]}
    assert ("base", run.name) in pairs and all(p["n"] == 2 for p in body["paired"])


def test_an_adapter_loads_in_the_hf_backend_and_changes_the_model(
    trained: tuple[Path, Path],
) -> None:
    import torch

    from agents.llm.backends.hf_backend import HFBackend

    config, run = trained
    base = json.loads((run / "config.json").read_text())["config"]["model"]["base"]
    plain = HFBackend(base, share_model=False)
    tuned = HFBackend(base, adapter=run, share_model=False)  # a run folder means its adapter/
    assert tuned.adapter == str((run / "adapter").resolve())
    assert tuned.model != plain.model and "+lora-" in tuned.model
    a, b = plain.loaded.model, tuned.loaded.model
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert not torch.allclose(a(ids).logits, b(ids).logits)
    with pytest.raises(ValueError, match="not a PEFT adapter folder"):
        HFBackend(base, adapter=config.parent)


def test_one_grpo_step_from_the_sft_adapter(trained: tuple[Path, Path]) -> None:
    from market.train.llm_train import read_log, run_stage

    config, _ = trained
    run = run_stage("grpo", config, config.parent / "grpo", run_eval=False, say=lambda _: None)
    rows = [r for r in read_log(run) if r["stage"] == "grpo"]
    assert rows and rows[-1]["step"] == 1
    assert (run / "adapter" / "adapter_config.json").is_file()
    stats = json.loads((run / "reward_stats.json").read_text())
    assert stats["scored"] >= 2  # the env scored the group's completions


def test_bad_configs_are_one_line_per_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from market.cli import main as cli

    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nbase = "x"\ndtpe = "float32"\n[sft]\nsteps = 0\n', encoding="utf-8")
    assert cli(["train-llm", "sft", str(bad), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert any("model.dtpe: unknown key" in line for line in err), err
    assert any("sft.steps: Input should be greater than or equal to 1" in line for line in err)
    assert not any("Traceback" in line for line in err)
    bad.write_text('[model]\nbase = "x"\n[data]\nseeds = "0:10"\n[eval]\nseeds = "5:8"\n')
    assert cli(["train-llm", "sft", str(bad)]) == 2
    assert "held-out seeds must not be trained on" in capsys.readouterr().err
    assert cli(["train-llm", "sft", str(tmp_path / "none.toml")]) == 2
    assert "no such file" in capsys.readouterr().err
