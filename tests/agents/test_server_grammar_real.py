"""The decision's grammar through the REAL llama.cpp server CI builds (llama-cpp-python's server,
SmolLM2-135M GGUF, 127.0.0.1): fixed bidder decisions of seed-0 market_round and
coalition_market episodes, one request each, greedy, no repair. Every reply must parse into a
legal action of the seat, but for a bid's order (prices non-increasing: JSON schema cannot state
it, so the grammar allows ``[20, 21]`` and the repair loop asks the model to sort; without repair
it stays a parse error), and the env's own checks (``market.core.action_checks.refusals``)
must accept at least :data:`ACCEPTED_FLOOR` of them (tests/agents/server_grammar_measure.py
measures before and after; docs/llm-seats.md gives the figures)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from real_model_utils import (
    LLAMA_INSTALL,
    LLAMA_SERVER_MODULES,
    LlamaServer,
    require_gguf,
    require_modules,
)
from server_grammar_measure import ask, backends, bidder_decisions

from agents.llm.decision_grammar import decision_schema
from agents.llm.server_grammar import to_dialect

#: fixed decisions asked (half bidding, half negotiation turns)
DECISIONS = 4
#: the share of replies the env accepts, at least (measured: see the module docstring)
ACCEPTED_FLOOR = 0.5


@pytest.fixture(scope="module")
def llama() -> Iterator[LlamaServer]:
    gguf = require_gguf()
    require_modules(LLAMA_SERVER_MODULES, LLAMA_INSTALL)
    server = LlamaServer(gguf, n_ctx=4096, n_threads=2)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.mark.real_model
@pytest.mark.slow
def test_the_servers_replies_under_the_decisions_grammar_parse_and_pass(
    llama: LlamaServer, record_property: Any
) -> None:
    backend = backends(llama.base_url, llama.alias)["after"]
    decisions = bidder_decisions(DECISIONS)
    assert len(decisions) == DECISIONS
    rows = []
    for obs in decisions:
        row = ask(backend, obs)
        # the grammar the server got was the decision's, in llama.cpp's dialect
        grammar = decision_schema(obs, 96, count=backend.count_tokens)
        assert row["degraded"] == to_dialect(grammar or {}, "llama.cpp")[1]
        rows.append(row)
    record_property("server_grammar", [(r["phase"], r["accepted"], r["raw"]) for r in rows])
    unparsed = [r for r in rows if not r["parsed"]]
    assert all("non-increasing" in r["why"] for r in unparsed), [(r["raw"], r["why"]) for r in rows]
    assert len(unparsed) < len(rows)
    assert all(r["finish"] != "length" for r in rows), [r["raw"] for r in rows]
    accepted = sum(r["accepted"] for r in rows)
    assert accepted >= ACCEPTED_FLOOR * len(rows), [(r["raw"], r["why"]) for r in rows]
