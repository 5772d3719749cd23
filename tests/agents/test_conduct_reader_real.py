"""The LLM conduct reader against the REAL llama.cpp server (llama-cpp-python with SmolLM2-135M,
started here on a free 127.0.0.1 port, 1 thread): every reading of a subset of the labelled
cases is either the model's (``method="llm"``, the model's name, rubric ``conduct-llm-1``) or a
counted rule fallback, the readings give agreement figures, and a second pass over the same
cases is answered by the cache alone: the second reader points at a port where nothing listens,
so any request would fail and show as a backend-error fallback.

What is asserted is the path, not the model's quality (a 135M model reads poorly; the measured
table is in docs/conduct.md). Skipped without the model or the server packages, unless
``GPUMARKET_REQUIRE_REAL_MODELS=1`` (see tests/real_model_utils.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conduct_cases import CASES, FACTS, HELD_OUT, NOW, OTHER, SEAT, agreement, reading_labels
from real_model_utils import (
    LLAMA_INSTALL,
    LLAMA_SERVER_MODULES,
    LlamaServer,
    free_port,
    require_gguf,
    require_modules,
)

from agents.llm.conduct_reader import LLM_RUBRIC_VERSION, LLMConductReader, make_conduct_reader
from market.core.conduct import RUBRIC_VERSION

pytestmark = [pytest.mark.real_model, pytest.mark.slow]
MODEL = "smollm2-135m"
# one case of each kind: true and false claims, kept and broken promises, each flag, innocents
SUBSET = [CASES[i] for i in (0, 18, 42, 48, 73, 81, 86, 92)] + [HELD_OUT[-1]]


@pytest.fixture(scope="module")
def llama(request: pytest.FixtureRequest) -> Iterator[LlamaServer]:
    require_modules(LLAMA_SERVER_MODULES, LLAMA_INSTALL)
    server = LlamaServer(require_gguf(), n_ctx=2048, n_threads=1)
    request.addfinalizer(server.stop)
    server.start()
    yield server


def reader(base_url: str, cache: Path) -> LLMConductReader:
    built = make_conduct_reader(
        f"llm:openai?model={MODEL}&base_url={base_url}&provider=llama.cpp&timeout=120"
        f"&max_retries=0&cache={cache}"
    )
    assert isinstance(built, LLMConductReader)
    return built


def test_the_real_model_reads_every_text_or_falls_back_counted(
    llama: LlamaServer, tmp_path: Path
) -> None:
    cache = tmp_path / "conduct.sqlite"
    first = reader(llama.base_url, cache)
    readings = [first.read(SEAT, NOW, "message", case.text, (OTHER,), FACTS) for case in SUBSET]
    stats = first.stats()
    assert stats["texts"] == len(SUBSET) and stats["cache_hits"] == 0
    models = [r for r in readings if r.method == "llm"]
    fallbacks = [r for r in readings if r.method == "rule-fallback"]
    assert len(models) + len(fallbacks) == len(SUBSET), [r.method for r in readings]
    assert first.fallbacks == len(fallbacks), llama.log_tail(800)
    # the server answered (no backend error); any fallback is an invalid reply, counted
    assert "backend error" not in first.fallback_reasons, first.last_error
    assert all((r.model, r.rubric) == (MODEL, LLM_RUBRIC_VERSION) for r in models)
    assert all((r.model, r.rubric) == (MODEL, RUBRIC_VERSION) for r in fallbacks)
    for r in models:
        assert all(f.reason == f"model opinion ({MODEL}, {LLM_RUBRIC_VERSION})" for f in r.flags)
    assert first.calls == len(SUBSET) + first.repairs_made
    table = agreement(SUBSET, lambda c: reading_labels(readings[SUBSET.index(c)], c))
    assert all(0.0 <= p <= 1.0 and 0.0 <= rec <= 1.0 for _, p, rec in table.values())
    first.close()

    # the second pass: the cache answers everything; nothing listens at the new base URL
    second = reader(f"http://127.0.0.1:{free_port()}/v1", cache)
    again = [second.read(SEAT, NOW, "message", case.text, (OTHER,), FACTS) for case in SUBSET]
    assert second.calls == 0 and second.cache_hits == len(SUBSET)
    assert "backend error" not in second.fallback_reasons
    assert again == readings
    second.close()
