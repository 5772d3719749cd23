"""The held-out curve of a training run: the seat's return on the evaluation seeds at every
saved checkpoint (``eval.checkpoints = true``).

A per-step training reward is measured on a handful of training prompts and is noisy; whether
a run improves is answered on held-out seeds. With ``eval.checkpoints`` the eval stage plays
each checkpoint TRL saved (``checkpoints/checkpoint-N``, every ``save_steps``) as a contender
labelled ``step-N``, beside the run's starting point (the base model for SFT, ``grpo.init`` for
GRPO) at step 0 and the final adapter at the last step, and draws ``heldout_curve.png``: mean
return with its 95% CI against the training step, one panel per scenario, the baselines as
horizontal lines.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from market.train.llm_config import TrainLLMConfig

CHECKPOINT = re.compile(r"checkpoint-(\d+)")
STEP_LABEL = "step-{step}"


def saved_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint in ``out/checkpoints`` that holds an adapter, by step."""
    found: list[tuple[int, Path]] = []
    root = out / "checkpoints"
    if not root.is_dir():
        return found
    for folder in root.iterdir():
        match = CHECKPOINT.fullmatch(folder.name)
        if match and (folder / "adapter_config.json").is_file():
            found.append((int(match.group(1)), folder))
    return sorted(found)


def run_stage_of(out: Path) -> str | None:
    """The stage the run folder ``out`` trained (``sft``, ``grpo``), None when it trained none."""
    stored = out / "config.json"
    if not stored.is_file():
        return None
    stage = json.loads(stored.read_text(encoding="utf-8")).get("stage")
    return stage if stage in ("sft", "grpo") else None


def trained_steps(cfg: TrainLLMConfig, out: Path) -> int:
    stage = run_stage_of(out)
    return cfg.grpo.steps if stage == "grpo" else cfg.sft.steps if stage == "sft" else 0


def curve_start(cfg: TrainLLMConfig, out: Path) -> str | None:
    """The contender at step 0 of the held-out curve: ``grpo.init`` of a GRPO run, else the base
    model (None without ``eval.checkpoints``)."""
    if not cfg.eval.checkpoints:
        return None
    if run_stage_of(out) == "grpo" and cfg.grpo.init:
        return Path(cfg.grpo.init).name
    return "base" if cfg.eval.base else None


def curve_points(
    contenders: dict[str, Any], start: str | None, final: str | None, last_step: int
) -> list[tuple[int, str]]:
    """(step, contender label) of the curve: ``start`` at step 0, every ``step-N`` contender,
    and ``final`` at ``last_step`` unless a checkpoint already stands there."""
    points: list[tuple[int, str]] = []
    if start and start in contenders:
        points.append((0, start))
    for label in contenders:
        match = re.fullmatch(r"step-(\d+)", label)
        if match:
            points.append((int(match.group(1)), label))
    if final and final in contenders and all(step != last_step for step, _ in points):
        points.append((last_step, final))
    return sorted(points)


def plot_heldout(
    report: dict[str, Any],
    out: Path,
    start: str | None,
    final: str | None,
    last_step: int,
    baselines: list[str],
) -> Path | None:
    """``out/heldout_curve.png`` (None without matplotlib or fewer than two points)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    scenarios = report.get("scenarios", {})
    panels = []
    for name, result in scenarios.items():
        per = result["contenders"]
        points = curve_points(per, start, final, last_step)
        if len(points) >= 2:
            panels.append((name, per, points))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.8), squeeze=False)
    for ax, (name, per, points) in zip(axes[0], panels, strict=True):
        steps = [s for s, _ in points]
        means = [per[label]["mean_return"] for _, label in points]
        cis = [per[label]["ci95"] for _, label in points]
        ax.errorbar(steps, means, yerr=cis, marker="o", capsize=3, lw=1.5, label=out.name)
        for i, b in enumerate(x for x in baselines if x in per):
            mean = per[b]["mean_return"]
            ax.axhline(mean, ls="--", lw=1, color=f"C{i + 1}", label=f"{b[-40:]} ({mean:+.2f})")
        ax.set_title(f"{name}: held-out return ({report['seeds'][0]}:{report['seeds'][1]})")
        ax.set_xlabel("training step")
        ax.set_ylabel("mean return, 95% CI")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "heldout_curve.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
