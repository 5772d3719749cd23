"""The held-out curve (market/train/heldout_curve.py, ``eval.checkpoints``): which checkpoints a
run's eval plays, under which labels, and the curve drawn from the report."""

from __future__ import annotations

import json
from pathlib import Path

from market.train.heldout_curve import curve_points, plot_heldout, saved_checkpoints
from market.train.llm_config import TrainLLMConfig, parse_config
from market.train.llm_train import contenders


def adapter_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    return path


def grpo_run(tmp_path: Path, saved: list[int]) -> tuple[Path, Path]:
    init = adapter_folder(tmp_path / "sft-run" / "adapter").parent
    out = tmp_path / "grpo-run"
    for step in saved:
        adapter_folder(out / "checkpoints" / f"checkpoint-{step}")
    adapter_folder(out / "adapter")
    (out / "config.json").write_text(json.dumps({"stage": "grpo", "config": {}}))
    return init, out


def config(init: Path, steps: int, checkpoints: bool) -> TrainLLMConfig:
    return parse_config(
        {
            "model": {"base": "model.gguf"},
            "grpo": {"init": str(init), "steps": steps, "save_steps": 8},
            "eval": {"checkpoints": checkpoints, "baselines": ["truthful"]},
        },
        init.parent,
    )


def test_checkpoints_are_found_by_their_step_number_and_only_with_an_adapter(
    tmp_path: Path,
) -> None:
    for step in (100, 8, 16):
        adapter_folder(tmp_path / "checkpoints" / f"checkpoint-{step}")
    (tmp_path / "checkpoints" / "checkpoint-24").mkdir()  # no adapter in it: not a checkpoint
    (tmp_path / "checkpoints" / "runs").mkdir()
    assert [step for step, _ in saved_checkpoints(tmp_path)] == [8, 16, 100]
    assert saved_checkpoints(tmp_path / "nowhere") == []


def test_the_eval_plays_the_start_every_checkpoint_and_the_final_adapter(tmp_path: Path) -> None:
    init, out = grpo_run(tmp_path, [8, 16, 24])
    labels = [label for label, _ in contenders(config(init, 24, True), out, "cpu")]
    # the checkpoint at the last step is the final adapter: played once, under the run's name
    assert labels == ["base", "sft-run", "step-8", "step-16", "grpo-run", "truthful"]
    specs = dict(contenders(config(init, 24, True), out, "cpu"))
    assert specs["step-16"].endswith(f"adapter={(out / 'checkpoints' / 'checkpoint-16').resolve()}")
    assert specs["sft-run"].endswith(f"adapter={(init / 'adapter').resolve()}")
    without = [label for label, _ in contenders(config(init, 24, False), out, "cpu")]
    assert without == ["base", "grpo-run", "truthful"]


def report(means: dict[str, float]) -> dict[str, object]:
    per = {k: {"mean_return": v, "ci95": 0.1} for k, v in means.items()}
    return {"seeds": [1000, 1060], "scenarios": {"market_round": {"contenders": per}}}


def test_the_curve_runs_from_the_start_through_the_checkpoints_to_the_final_adapter() -> None:
    per = {"base": 1, "sft": 2, "step-16": 4, "step-8": 3, "grpo": 5, "truthful": 0}
    assert curve_points(per, "sft", "grpo", 24) == [
        (0, "sft"),
        (8, "step-8"),
        (16, "step-16"),
        (24, "grpo"),
    ]
    # a checkpoint saved at the last step stands for the final adapter
    assert curve_points({**per, "step-24": 6}, "sft", "grpo", 24)[-1] == (24, "step-24")


def test_the_heldout_curve_is_drawn_from_the_report(tmp_path: Path) -> None:
    rep = report({"sft": 1.2, "step-8": 1.5, "grpo": 1.8, "truthful": 1.6})
    path = plot_heldout(rep, tmp_path, "sft", "grpo", 16, ["truthful"])
    assert path == tmp_path / "heldout_curve.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one point is no curve
    assert plot_heldout(report({"grpo": 1.0}), tmp_path / "x", "sft", "grpo", 16, []) is None
