"""The TOML configuration of ``gpumarket train-llm`` (a pydantic model, read with clear errors).

Every field has a default except ``model.base``; an unknown key, a wrong type or a bad value is
a :class:`TrainConfigError` whose message lists every problem, one line each, naming the key.
Relative paths are read relative to the config file's folder.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from market.train.grpo import parse_horizon


class TrainConfigError(ValueError):
    """A config file that cannot be used; the message says what and where, one line each."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def seed_range(text: str | list[int]) -> list[int]:
    """``"0:40"`` (start inclusive, end exclusive), ``"3"`` or a list of ints."""
    if isinstance(text, list):
        return [int(x) for x in text]
    text = str(text).strip()
    if ":" in text:
        a, _, b = text.partition(":")
        start, stop = int(a), int(b)
        if stop <= start:
            raise ValueError(f"seed range {text!r} is empty (END must be larger than START)")
        return list(range(start, stop))
    return [int(text)]


class ModelSection(_Section):
    base: str = Field(description="a model folder, a .gguf file or a Hub id in the local cache")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu


class SeatSection(_Section):
    seat: str = "bidder_0"
    scenarios: list[str] = Field(default_factory=lambda: ["market_round"], min_length=1)


class DataSection(_Section):
    teacher: str = "rule_expert"  # the agent whose decisions are learnt (played by the runner)
    seeds: str | list[int] = "0:40"
    phases: list[Literal["design", "negotiation", "bidding"]] = Field(default_factory=list)
    valid_only: bool = True
    min_return: float | None = None
    workers: int = Field(default=0, ge=0)  # 0: every core

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: str | list[int]) -> str | list[int]:
        seed_range(v)
        return v


class LoraSection(_Section):
    r: int = Field(default=16, ge=1)
    alpha: int = Field(default=32, ge=1)
    dropout: float = Field(default=0.05, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        min_length=1,
    )


class SFTSection(_Section):
    steps: int = Field(default=200, ge=1)
    batch_size: int = Field(default=4, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    learning_rate: float = Field(default=2e-4, gt=0)
    max_length: int = Field(default=4096, ge=16)
    save_steps: int = Field(default=50, ge=1)
    seed: int = 0


class GRPOSection(_Section):
    init: str | None = None  # an SFT run folder (or adapter folder) to start from
    steps: int = Field(default=50, ge=1)
    batch_size: int = Field(default=8, ge=1)  # completions per step (prompts x generations)
    num_generations: int = Field(default=4, ge=2)
    learning_rate: float = Field(default=5e-6, gt=0)
    max_completion_length: int = Field(default=160, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    beta: float = Field(default=0.0, ge=0)
    horizon: str = "round"
    stand_in: str = "rule_expert"
    save_steps: int = Field(default=25, ge=1)
    seed: int = 0

    @field_validator("horizon")
    @classmethod
    def _horizon(cls, v: str) -> str:
        parse_horizon(v)
        return v


class EvalSection(_Section):
    seeds: str | list[int] = "1000:1060"  # held out: never in data.seeds
    baselines: list[str] = Field(default_factory=lambda: ["truthful", "rule_expert"])
    base: bool = True  # also evaluate the base model without an adapter
    compare: list[str] = Field(default_factory=list)  # other adapters (run folders) to evaluate
    # also evaluate every saved checkpoint: the held-out curve (market/train/heldout_curve.py)
    checkpoints: bool = False
    max_tokens: int = Field(default=160, ge=1)
    # the LLM seat's context in tokens; the training prompts are rendered at the budget that this
    # context and max_tokens leave, so the seat is sent the prompts it learnt from
    context: int = Field(default=2048, ge=256)
    memory: str = "none"  # the LLM seat's memory (none: the prompt it was trained on)
    retries: int = Field(default=1, ge=0)
    max_in_flight: int = Field(default=64, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] | None = None  # None: model.dtype

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: str | list[int]) -> str | list[int]:
        seed_range(v)
        return v


class TrainLLMConfig(_Section):
    model: ModelSection
    seat: SeatSection = Field(default_factory=SeatSection)
    data: DataSection = Field(default_factory=DataSection)
    lora: LoraSection = Field(default_factory=LoraSection)
    sft: SFTSection = Field(default_factory=SFTSection)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    eval: EvalSection = Field(default_factory=EvalSection)

    def resolve_paths(self, folder: Path) -> TrainLLMConfig:
        """Relative file paths made absolute against ``folder`` (the config file's)."""
        out = self.model_copy(deep=True)
        base = folder / out.model.base
        if base.exists():
            out.model.base = str(base.resolve())
        if out.grpo.init:
            out.grpo.init = str((folder / out.grpo.init).resolve())
        out.eval.compare = [str((folder / c).resolve()) for c in out.eval.compare]
        return out

    def check(self) -> None:
        """Cross-field rules: held-out seeds, the GRPO group."""
        overlap = set(seed_range(self.data.seeds)) & set(seed_range(self.eval.seeds))
        if overlap:
            raise TrainConfigError(
                f"eval.seeds: {len(overlap)} seed(s) also in data.seeds (e.g. {min(overlap)}); "
                "held-out seeds must not be trained on"
            )
        if self.grpo.batch_size % self.grpo.num_generations:
            raise TrainConfigError(
                f"grpo.batch_size ({self.grpo.batch_size}) must be a multiple of "
                f"grpo.num_generations ({self.grpo.num_generations})"
            )


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(x) for x in loc) or "(top level)"


def parse_config(data: dict[str, Any], folder: Path, name: str = "config") -> TrainLLMConfig:
    """A checked config from parsed TOML (``folder``: where relative paths start)."""
    try:
        cfg = TrainLLMConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            elif err["type"] == "missing":
                msg = "required key missing"
            lines.append(f"{name}: {_where(err['loc'])}: {msg}")
        raise TrainConfigError("\n".join(lines)) from None
    cfg.check()
    return cfg.resolve_paths(folder)


def load_config(path: str | Path) -> TrainLLMConfig:
    """Read and check a ``train-llm`` TOML file (:class:`TrainConfigError` on any problem)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TrainConfigError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainConfigError(f"{p}: cannot read it ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TrainConfigError(f"{p}: not valid TOML ({exc})") from None
    return parse_config(data, p.resolve().parent, str(p))
