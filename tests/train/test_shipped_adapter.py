"""The shipped SmolLM2 adapter (docs/training.md): its files are the ones measured (SHA256SUMS
beside them), it is a LoRA of the settings the docs state, and the wheel carries it."""

from __future__ import annotations

import hashlib
import json
import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = ROOT / "agents" / "llm" / "adapters" / "smollm2-135m-market_round-sft"


def test_the_shipped_adapter_matches_its_checksums() -> None:
    lines = (ADAPTER / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    sums = dict(reversed(line.split()) for line in lines if line.strip())
    assert set(sums) == {"adapter_config.json", "adapter_model.safetensors"}
    for name, digest in sums.items():
        assert hashlib.sha256((ADAPTER / name).read_bytes()).hexdigest() == digest, name


def test_the_shipped_adapter_is_the_lora_the_docs_describe() -> None:
    config = json.loads((ADAPTER / "adapter_config.json").read_text(encoding="utf-8"))
    assert config["peft_type"] == "LORA"
    assert (config["r"], config["lora_alpha"]) == (16, 32)
    assert "LoRA r 16, alpha 32" in (ROOT / "docs" / "training.md").read_text(encoding="utf-8")


def test_the_wheel_carries_the_adapter_and_the_example_config() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_data = data["tool"]["setuptools"]["package-data"]
    for path in ADAPTER.iterdir():
        rel = path.relative_to(ROOT / "agents" / "llm").as_posix()
        assert any(fnmatch(rel, pattern) for pattern in package_data["agents.llm"]), rel
    assert any(
        fnmatch("configs/smollm2_market_round.toml", p) for p in package_data["market.train"]
    )
