"""The shipped SmolLM2 adapters (docs/training.md): their files are the ones measured (SHA256SUMS
beside them), each is a LoRA of the settings the docs state, and the wheel carries them."""

from __future__ import annotations

import hashlib
import json
import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "agents" / "llm" / "adapters"
ADAPTER = SHIPPED / "smollm2-135m-market_round-sft"
ADAPTERS = [ADAPTER, SHIPPED / "smollm2-135m-daedalus-designer-grpo"]


def test_the_shipped_adapters_match_their_checksums() -> None:
    assert sorted(p.name for p in SHIPPED.iterdir()) == sorted(a.name for a in ADAPTERS)
    for adapter in ADAPTERS:
        lines = (adapter / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
        sums = dict(reversed(line.split()) for line in lines if line.strip())
        assert set(sums) == {"adapter_config.json", "adapter_model.safetensors"}
        for name, digest in sums.items():
            assert hashlib.sha256((adapter / name).read_bytes()).hexdigest() == digest, name


def test_the_shipped_adapters_are_the_loras_the_docs_describe() -> None:
    docs = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    for adapter in ADAPTERS:
        config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
        assert config["peft_type"] == "LORA"
        assert (config["r"], config["lora_alpha"]) == (16, 32)
        assert f"agents/llm/adapters/{adapter.name}" in docs
    assert "LoRA r 16, alpha 32" in docs


def test_the_wheel_carries_the_adapter_and_the_example_config() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_data = data["tool"]["setuptools"]["package-data"]
    for path in (p for a in ADAPTERS for p in a.iterdir()):
        rel = path.relative_to(ROOT / "agents" / "llm").as_posix()
        assert any(fnmatch(rel, pattern) for pattern in package_data["agents.llm"]), rel
    assert any(
        fnmatch("configs/smollm2_market_round.toml", p) for p in package_data["market.train"]
    )
