"""``gpumarket train-llm``: LoRA fine-tuning of an LLM seat with TRL, and its held-out evaluation.

Three stages, each writing one **run folder** (``--out``):

- ``sft``: the teacher agent (``data.teacher``, e.g. ``rule_expert``) plays the seat in the
  normal runner over ``data.seeds`` (the transcripts are kept in ``RUN/data/SCENARIO``); its
  decisions are rendered as the prompts an LLM seat is sent and filtered as ``gpumarket
  export-sft --include-scripted --agent TEACHER --seat SEAT`` filters them
  (:func:`market.train.training_data.select_decisions`), written to ``RUN/sft.jsonl``, and a PEFT
  LoRA adapter is trained on them with TRL's ``SFTTrainer`` (loss on the reply only).
- ``grpo``: the same decisions are the prompts of TRL's ``GRPOTrainer``, each completion scored by
  :class:`market.train.grpo.EnvReward` (the real env, stepped from the recorded state). It starts
  from ``grpo.init`` (an SFT run folder) or a fresh adapter.
- ``eval``: the seat is played on the held-out ``eval.seeds`` through the normal runner by the
  base model, this run's adapter (``llm:hf?path=BASE&adapter=RUN/adapter``), the adapters of
  ``eval.compare`` and the ``eval.baselines``; per contender the mean return with its 95% CI, the
  valid-action, fallback and refusal rates, and paired differences (same seeds) with 95% CIs.
  ``sft`` and ``grpo`` run it at their end unless ``--no-eval``.

The run folder: ``config.toml`` (a copy of the file) and ``config.json`` (resolved),
``checkpoints/`` (TRL's, for resuming), ``adapter/`` (the final PEFT adapter), ``log.jsonl``
(every logged training step: loss, learning rate, reward...), ``curves.png`` (when matplotlib is
installed), ``eval/`` (the runner's folders), ``eval.json`` and ``eval.md``. Given again, a run
folder continues: the teacher's episodes already played are kept, training resumes from the last
checkpoint, finished evaluation episodes are kept. A folder holding another configuration is
refused (``--fresh`` starts over).

torch, transformers, trl, peft and datasets are imported by the functions that use them.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from agents.llm.backends.hf_loading import ModelKey, load_model, resolve_adapter
from agents.llm.prompts import prompt_budget
from market.run.evaluation import slug
from market.run.rollout import mean_ci95
from market.run.runner import run_scenario
from market.train.grpo import EnvReward
from market.train.heldout_curve import (
    STEP_LABEL,
    curve_start,
    plot_heldout,
    saved_checkpoints,
    trained_steps,
)
from market.train.llm_config import TrainConfigError, TrainLLMConfig, load_config, seed_range
from market.train.training_data import (
    ExportCounts,
    ExportFilter,
    grpo_records,
    select_decisions,
    write_jsonl,
)

STAGES = ("sft", "grpo", "eval")
#: the sections of the config that make a stage's run: another value is another run
STAGE_SECTIONS = {
    "sft": ("model", "seat", "data", "lora", "sft"),
    "grpo": ("model", "seat", "data", "lora", "grpo"),
    "eval": ("model", "seat"),
}
LOG = "log.jsonl"
Say = Callable[[str], None]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --- the run folder --------------------------------------------------------------------------


def open_run(
    cfg: TrainLLMConfig, config_path: str | Path, out: Path, stage: str, fresh: bool = False
) -> Path:
    """Create or reopen the run folder ``out`` for ``stage`` (see the module docstring)."""
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = cfg.model_dump(mode="json")
    stored = out / "config.json"
    if stored.is_file():
        old = json.loads(stored.read_text(encoding="utf-8"))
        if old.get("stage") not in (None, stage) and stage != "eval":
            raise TrainConfigError(
                f"{out} holds a {old.get('stage')} run, not a {stage} run; use another --out"
            )
        changed = [
            s for s in STAGE_SECTIONS[stage] if old.get("config", {}).get(s) != resolved.get(s)
        ]
        if changed:
            raise TrainConfigError(
                f"{out} holds a run of another configuration ({', '.join(changed)} differ); "
                "use another --out, or --fresh to start over"
            )
        if stage == "eval":
            return out
    body = {"stage": stage, "config": resolved}
    stored.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    shutil.copyfile(config_path, out / "config.toml")
    return out


def pick_device(name: str) -> str:
    """``auto``: ``cuda`` when torch sees a GPU, else ``cpu``; any other name as given."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# --- data ------------------------------------------------------------------------------------


def teacher_runs(cfg: TrainLLMConfig, out: Path, say: Say = _say) -> list[Path]:
    """The teacher plays the seat over ``data.seeds`` in every scenario (resumable run folders
    under ``out/data``); returns the folders."""
    seeds = seed_range(cfg.data.seeds)
    folders = []
    for scenario in cfg.seat.scenarios:
        folder = out / "data" / slug(scenario)
        summary = run_scenario(
            scenario,
            seeds,
            {cfg.seat.seat: cfg.data.teacher},
            folder,
            workers=cfg.data.workers or None,
            progress=False,
        )
        if summary.failed:
            seed, why = next(iter(summary.failed.items()))
            raise TrainConfigError(f"{scenario} seed {seed}: the teacher's episode failed: {why}")
        say(f"data: {scenario}: {len(summary.episodes)} teacher episode(s) in {folder}")
        folders.append(folder)
    return folders


def data_filter(cfg: TrainLLMConfig) -> ExportFilter:
    """The export filter of the teacher's decisions in the seat (as ``export-sft`` has it),
    rendering prompts at the budget the evaluated seat's context leaves (:func:`seat_budget`)."""
    return ExportFilter(
        seats=[cfg.seat.seat],
        agent=cfg.data.teacher,
        phases=list(cfg.data.phases) or None,
        min_return=cfg.data.min_return,
        valid_only=cfg.data.valid_only,
        include_scripted=True,
        max_prompt_tokens=seat_budget(cfg),
    )


def seat_budget(cfg: TrainLLMConfig) -> int | None:
    """The prompt budget of the LLM seat :func:`llm_spec` builds (its ``context`` and
    ``max_tokens``), as :class:`agents.llm.agent.LLMAgent` computes it."""
    return prompt_budget(cfg.eval.context, cfg.eval.max_tokens)


def sft_dataset(
    cfg: TrainLLMConfig, folders: Sequence[Path], out: Path, say: Say = _say
) -> list[dict[str, Any]]:
    """The SFT records (written to ``out/sft.jsonl``) as TRL prompt-completion rows."""
    counts = ExportCounts()
    records = list(select_decisions(folders, data_filter(cfg), counts=counts))
    if not records:
        raise TrainConfigError(f"no decision to learn: {counts.describe()}")
    write_jsonl(out / "sft.jsonl", records)
    say(f"data: {counts.describe()}; written to {out / 'sft.jsonl'}")
    return [
        {"prompt": r["messages"][:-1], "completion": [decoded_form(r["messages"][-1])]}
        for r in records
    ]


def decoded_form(message: dict[str, Any]) -> dict[str, Any]:
    """A JSON reply spaced as ``llm:hf``'s decision grammar decodes it (``", "`` and ``": "``),
    so the model learns the tokens it will be allowed to write; other text is kept as it is."""
    try:
        content = json.dumps(json.loads(message["content"]), ensure_ascii=False)
    except (TypeError, ValueError):
        return message
    return {**message, "content": content}


# --- models ----------------------------------------------------------------------------------


def load_base(cfg: TrainLLMConfig, device: str) -> tuple[Any, Any]:
    """The base model and tokenizer as the ``llm:hf`` backend loads them (a GGUF is dequantised,
    through the conversion cache), a private copy on ``device``."""

    loaded = load_model(
        ModelKey.of(cfg.model.base, device=device, dtype=cfg.model.dtype), shared=False
    )
    model, tokenizer = loaded.model, loaded.tokenizer
    # a model read from a GGUF is dequantised (plain float weights) but still flagged as GGUF
    # quantised, which the Trainer refuses to train: drop the flag
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def lora_config(cfg: TrainLLMConfig) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        task_type="CAUSAL_LM",
    )


def _log_callback(path: Path, stage: str) -> Any:
    from transformers import TrainerCallback

    class JsonlLog(TrainerCallback):  # type: ignore[misc,unused-ignore]
        """Appends every logged step to the run's ``log.jsonl``."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            row = {"stage": stage, "step": int(state.global_step), "time": round(time.time(), 3)}
            for k, v in (logs or {}).items():
                if isinstance(v, int | float) and math.isfinite(float(v)):
                    row[k] = float(v)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    return JsonlLog()


def _resume_point(checkpoints: Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    if not checkpoints.is_dir():
        return None
    last = get_last_checkpoint(str(checkpoints))  # type: ignore[no-untyped-call,unused-ignore]
    return str(last) if last else None


def _common_args(
    cfg: TrainLLMConfig, out: Path, device: str, seed: int, save_steps: int
) -> dict[str, Any]:
    cuda = device.startswith("cuda")
    return {
        "output_dir": str(out / "checkpoints"),
        "logging_steps": 1,
        "save_steps": save_steps,
        # every checkpoint is kept when the eval plays them all (the held-out curve)
        "save_total_limit": None if cfg.eval.checkpoints else 2,
        "seed": seed,
        "data_seed": seed,
        "report_to": "none",
        "use_cpu": device == "cpu",
        "bf16": cuda and cfg.model.dtype != "float16",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def _train_and_save(trainer: Any, out: Path, stage: str, plan: str, say: Say) -> Path:
    """Train (from the last checkpoint in ``out``, if any), save the adapter, plot the curves."""
    resume = _resume_point(out / "checkpoints")
    if resume:
        say(f"{stage}: resuming from {resume}")
    say(f"{stage}: {plan}")
    trainer.train(resume_from_checkpoint=resume)
    adapter = out / "adapter"
    trainer.save_model(str(adapter))
    say(f"{stage}: adapter written to {adapter} ({trainer.state.global_step} steps)")
    plot_curves(out)
    return adapter


def train_sft(cfg: TrainLLMConfig, out: Path, say: Say = _say) -> Path:
    """The ``sft`` stage (see the module docstring); returns the adapter folder."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer  # type: ignore[attr-defined,unused-ignore]

    rows = sft_dataset(cfg, teacher_runs(cfg, out, say), out, say)
    device = pick_device(cfg.model.device)
    model, tokenizer = load_base(cfg, device)
    s = cfg.sft
    args = SFTConfig(
        **_common_args(cfg, out, device, s.seed, s.save_steps),
        max_steps=s.steps,
        per_device_train_batch_size=s.batch_size,
        gradient_accumulation_steps=s.grad_accum,
        learning_rate=s.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, s.steps // 20),
        max_length=s.max_length,
        packing=False,
        completion_only_loss=True,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora_config(cfg),
        callbacks=[_log_callback(out / LOG, "sft")],
    )
    plan = f"{len(rows)} decisions, {s.steps} steps of {s.batch_size} on {device}"
    return _train_and_save(trainer, out, "sft", plan, say)


def train_grpo(cfg: TrainLLMConfig, out: Path, say: Say = _say) -> Path:
    """The ``grpo`` stage (see the module docstring); returns the adapter folder."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined,unused-ignore]

    folders = teacher_runs(cfg, out, say)
    counts = ExportCounts()
    rows = grpo_records(folders, data_filter(cfg), counts=counts)
    if not rows:
        raise TrainConfigError(f"no decision to score: {counts.describe()}")
    say(f"data: {counts.describe()} (GRPO prompts)")
    device = pick_device(cfg.model.device)
    model, tokenizer = load_base(cfg, device)
    g = cfg.grpo
    peft_config = lora_config(cfg)
    if g.init:
        from peft import PeftModel

        try:
            init = resolve_adapter(g.init)
        except ValueError as exc:
            raise TrainConfigError(f"grpo.init: {exc}") from None
        model = PeftModel.from_pretrained(model, init, is_trainable=True)
        peft_config = None
        say(f"grpo: starting from the adapter {init}")
    reward = EnvReward(g.horizon, stand_in=g.stand_in)
    common = _common_args(cfg, out, device, g.seed, g.save_steps)
    common["bf16"] = False  # bf16 autocast gave NaN gradients in GRPO on an H200 (float32 here)
    args = GRPOConfig(
        **common,
        max_steps=g.steps,
        per_device_train_batch_size=g.batch_size,
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        learning_rate=g.learning_rate,
        temperature=g.temperature,
        beta=g.beta,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=cast(Any, reward),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_log_callback(out / LOG, "grpo")],
    )
    plan = f"{len(rows)} prompts, {g.steps} steps of {g.batch_size} completions on {device}"
    adapter = _train_and_save(trainer, out, "grpo", plan, say)
    (out / "reward_stats.json").write_text(json.dumps(dict(reward.stats)) + "\n")
    return adapter


# --- curves ----------------------------------------------------------------------------------


def read_log(out: Path) -> list[dict[str, Any]]:
    """The run's logged steps, the last row of each (stage, step) kept (a resumed run logs a
    step again)."""
    path = out / LOG
    if not path.is_file():
        return []
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            key = (row["stage"], row["step"])
            rows[key] = {**rows.get(key, {}), **row}
    return [rows[k] for k in sorted(rows)]


CURVE_KEYS = ("loss", "reward", "gpumarket/parse_failure_rate", "learning_rate")


def plot_curves(out: Path) -> Path | None:
    """``out/curves.png``: each logged quantity of :data:`CURVE_KEYS` against the step (None
    without matplotlib or a log)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = read_log(out)
    keys = [k for k in CURVE_KEYS if any(k in r for r in rows)]
    if not keys:
        return None
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.4 * len(keys)), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1)
        ax.set_ylabel(key.split("/")[-1] if key.startswith("rewards/") else key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(f"{out.name}: training curves")
    fig.tight_layout()
    path = out / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --- evaluation ------------------------------------------------------------------------------


def llm_spec(cfg: TrainLLMConfig, device: str, adapter: str | Path | None = None) -> str:
    """The ``llm:hf`` spec of the base model (with ``adapter``: of the adapted model)."""
    e = cfg.eval
    spec = (
        f"llm:hf?path={cfg.model.base}&device={device}&dtype={e.dtype or cfg.model.dtype}"
        f"&memory={e.memory}&retries={e.retries}&max_tokens={e.max_tokens}&context={e.context}"
        f"&max_batch={e.max_in_flight}"
    )
    return spec + (f"&adapter={Path(adapter).resolve()}" if adapter else "")


def contenders(cfg: TrainLLMConfig, out: Path, device: str) -> list[tuple[str, str]]:
    """(label, spec) of everything the eval plays in the seat."""

    found: list[tuple[str, str]] = []
    if cfg.eval.base:
        found.append(("base", llm_spec(cfg, device)))
    others = list(cfg.eval.compare)
    start = curve_start(cfg, out)
    if start and start != "base" and cfg.grpo.init and cfg.grpo.init not in others:
        others.insert(0, cfg.grpo.init)  # the curve's step 0
    for other in others:
        try:
            found.append((Path(other).name, llm_spec(cfg, device, resolve_adapter(other))))
        except ValueError as exc:
            raise TrainConfigError(f"eval.compare: {exc}") from None
    if cfg.eval.checkpoints:
        for step, folder in saved_checkpoints(out):
            if step != trained_steps(cfg, out):  # the final adapter below is that checkpoint
                found.append((STEP_LABEL.format(step=step), llm_spec(cfg, device, folder)))
    if (out / "adapter" / "adapter_config.json").is_file():
        found.append((out.name, llm_spec(cfg, device, out / "adapter")))
    found.extend((b, b) for b in cfg.eval.baselines)
    return found


def _rate(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def evaluate(cfg: TrainLLMConfig, out: Path, say: Say = _say) -> dict[str, Any]:
    """The ``eval`` stage: play every contender in the seat on ``eval.seeds`` (see the module
    docstring); writes ``out/eval.json`` and ``out/eval.md`` and returns the report."""
    device = pick_device(cfg.model.device)
    seeds = seed_range(cfg.eval.seeds)
    seat = cfg.seat.seat
    n = cfg.eval.max_in_flight
    report: dict[str, Any] = {"seat": seat, "seeds": [seeds[0], seeds[-1] + 1], "scenarios": {}}
    for scenario in cfg.seat.scenarios:
        per: dict[str, dict[str, Any]] = {}
        returns: dict[str, dict[int, float]] = {}
        for label, spec in contenders(cfg, out, device):
            began = time.perf_counter()
            summary = run_scenario(
                scenario,
                seeds,
                {seat: spec},
                out / "eval" / slug(scenario) / slug(label),
                progress=False,
                llm={"max_in_flight": n, "max_episodes": n, "per_endpoint": n},
            )
            rows = [r for r in summary.rows if r["seat"] == seat]
            returns[label] = summary.returns(seat)
            mean, ci = mean_ci95(list(returns[label].values()))
            decisions = sum(float(r.get("decisions") or 0) for r in rows)
            fallbacks = sum(float(r.get("fallbacks") or 0) for r in rows)
            refused = sum(float(r.get("invalid_actions") or 0) for r in rows)
            per[label] = {
                "spec": spec,
                "episodes": len(rows),
                "failed": len(summary.failed),
                "mean_return": mean,
                "ci95": ci,
                "decisions": int(decisions),
                "fallback_rate": _rate(fallbacks, decisions),
                "refused_rate": _rate(refused, decisions),
                "valid_action_rate": _rate(decisions - fallbacks - refused, decisions),
                "seconds": round(time.perf_counter() - began, 1),
            }
            say(
                f"eval: {scenario} {label}: {mean:+.4f} +/- {ci:.4f} over {len(rows)} seeds "
                f"(valid {per[label]['valid_action_rate']}, fallback {per[label]['fallback_rate']})"
            )
        report["scenarios"][scenario] = {"contenders": per, "paired": paired(returns)}
    (out / "eval.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / "eval.md").write_text(eval_markdown(report), encoding="utf-8")
    if cfg.eval.checkpoints:
        final = out.name if (out / "adapter" / "adapter_config.json").is_file() else None
        start = curve_start(cfg, out)
        plot_heldout(report, out, start, final, trained_steps(cfg, out), cfg.eval.baselines)
    return report


def paired(returns: dict[str, dict[int, float]]) -> list[dict[str, Any]]:
    """Every pair (a, b) of contenders: the mean of a - b over the seeds both played, with the
    half-width of its 95% CI (Student t)."""
    labels = list(returns)
    out = []
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            common = sorted(set(returns[a]) & set(returns[b]))
            diffs = [returns[a][s] - returns[b][s] for s in common]
            mean, ci = mean_ci95(diffs)
            out.append({"a": a, "b": b, "n": len(common), "mean_diff": mean, "ci95": ci})
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def eval_markdown(report: dict[str, Any]) -> str:
    lines = []
    for scenario, body in report["scenarios"].items():
        a, b = report["seeds"]
        lines += [
            f"### {scenario}, seat {report['seat']}, held-out seeds {a}:{b}",
            "",
            "| contender | mean return ± 95% CI | valid actions | fallbacks | refused | episodes |",
            "|---|---|---|---|---|---|",
        ]
        for label, c in body["contenders"].items():
            lines.append(
                f"| {label} | {c['mean_return']:+.4f} ± {c['ci95']:.4f} | "
                f"{_pct(c['valid_action_rate'])} | {_pct(c['fallback_rate'])} | "
                f"{_pct(c['refused_rate'])} | {c['episodes']} |"
            )
        lines += ["", "| paired difference (same seeds) | mean ± 95% CI | seeds |", "|---|---|---|"]
        for p in body["paired"]:
            lines.append(
                f"| {p['a']} − {p['b']} | {p['mean_diff']:+.4f} ± {p['ci95']:.4f} | {p['n']} |"
            )
        lines.append("")
    return "\n".join(lines)


# --- the command -----------------------------------------------------------------------------


def default_out(config: str | Path, stage: str) -> Path:
    return Path("runs") / "train-llm" / f"{Path(config).stem}-{stage}"


def run_stage(
    stage: str,
    config: str | Path,
    out: str | Path | None = None,
    *,
    fresh: bool = False,
    run_eval: bool = True,
    say: Say = _say,
) -> Path:
    """Run one stage of ``gpumarket train-llm`` (see the module docstring); returns the run
    folder. Raises :class:`TrainConfigError` for a bad config or run folder."""
    if stage not in STAGES:
        raise TrainConfigError(f"stage {stage!r}: use one of {', '.join(STAGES)}")
    cfg = load_config(config)
    folder = open_run(cfg, config, Path(out) if out else default_out(config, stage), stage, fresh)
    if stage == "sft":
        train_sft(cfg, folder, say)
    elif stage == "grpo":
        train_grpo(cfg, folder, say)
    if stage == "eval" or run_eval:
        evaluate(cfg, folder, say)
    return folder
