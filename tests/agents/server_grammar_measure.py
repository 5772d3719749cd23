"""Before/after measure of the decision grammar sent to a REAL llama.cpp server: fixed bidder
decisions (bidding and negotiation turns of seed-0 market_round and coalition_market episodes),
each asked once (no repair), greedy. "Before" sends the generic legal-action schema (what a
server seat got before the decision grammar); "after" the decision's grammar in llama.cpp's
dialect. A reply is accepted when it parses into a legal action of the seat and the env's checks
(``market.core.action_checks.refusals``) find nothing.

Run by hand: ``python tests/agents/server_grammar_measure.py [N]`` (starts its own server).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's code, not an install

from real_model_utils import LlamaServer, require_gguf  # noqa: E402
from test_llm_prompts import observations  # noqa: E402

from agents.llm.agent import LLMAgent  # noqa: E402
from agents.llm.backends.openai_backend import OpenAIBackend  # noqa: E402
from agents.llm.parsing import extract_json  # noqa: E402
from agents.llm.reasoning import split_think  # noqa: E402
from market.core.action_checks import refusals  # noqa: E402
from market.core.actions import ActionParseError  # noqa: E402
from market.environment import Observation  # noqa: E402

MAX_TOKENS = 96


def bidder_decisions(n: int) -> list[Observation]:
    """``n`` fixed bidder decisions, half from each scenario, spread evenly over the episode."""
    out: list[Observation] = []
    for name in ("market_round", "coalition_market"):
        pool = [o for o in observations(name) if o.role == "bidder" and "bid" in o.legal_actions]
        pool += [
            o
            for o in observations(name)
            if o.role == "bidder" and o.phase == "negotiation" and "send_offer" in o.legal_actions
        ]
        want = n // 2 + (n % 2 if name == "market_round" else 0)
        step = max(1, len(pool) // max(1, want))
        out += pool[::step][:want]
    return out


class GenericSchema(OpenAIBackend):
    """The server seat as it was: no schema dialect, so the generic legal-action schema."""

    def schema_dialect(self, fmt: str | None = None) -> str | None:
        return None


def ask(backend: OpenAIBackend, obs: Observation) -> dict[str, Any]:
    """One decision, no repair: the reply, whether it parsed and what the env's checks say."""
    agent = LLMAgent(
        backend, retries=0, max_tokens=MAX_TOKENS, memory="none", context=4096, temperature=0.0
    )
    agent.reset(0)
    agent.act(obs)
    ex = agent.last_exchange or {}
    raw = str(ex.get("raw") or "")
    row: dict[str, Any] = {
        "seat": obs.seat,
        "phase": obs.phase,
        "raw": raw,
        "finish": ex.get("finish_reason"),
        "degraded": ex.get("degraded"),
    }
    try:
        action = agent.parse_reply(raw, obs, semantic=False)
    except ActionParseError as exc:
        row.update(parsed=False, accepted=False, why=str(exc)[:160])
        return row
    found = refusals(action, obs)
    row.update(
        parsed=True,
        accepted=not found,
        action=action.action_type,
        why="; ".join(str(r) for r in found)[:160],
    )
    with contextlib.suppress(ActionParseError):
        row["value"] = extract_json(split_think(raw)[0])
    return row


def backends(base_url: str, model: str) -> dict[str, OpenAIBackend]:
    """The seat's server backend before (generic schema) and after (the decision's grammar)."""
    return {
        label: cls(
            model=model,
            base_url=base_url,
            provider="llama.cpp",
            response_format="json_object",
            timeout=900.0,
            max_retries=0,
        )
        for label, cls in (("before", GenericSchema), ("after", OpenAIBackend))
    }


def measure(base_url: str, model: str, decisions: list[Observation]) -> dict[str, Any]:
    """Each decision asked before and after in turn (the server reuses the same prompt's
    evaluation for the second request)."""
    rows: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for obs in decisions:
        for label, backend in backends(base_url, model).items():
            rows[label].append(ask(backend, obs))
            got = rows[label][-1]
            print(label, got["accepted"], obs.phase, repr(got["raw"][:100]), got.get("why", ""))
    return {
        label: {
            "decisions": len(got),
            "parsed": sum(r["parsed"] for r in got),
            "accepted": sum(r["accepted"] for r in got),
            "cut_off": sum(r["finish"] == "length" for r in got),
            "rows": got,
        }
        for label, got in rows.items()
    }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    decisions = bidder_decisions(n)
    with LlamaServer(require_gguf(), n_ctx=4096, n_threads=2) as server:
        result = measure(server.base_url, server.alias, decisions)
    for label in ("before", "after"):
        r = result[label]
        print(
            f"{label}: {r['accepted']}/{r['decisions']} accepted, {r['parsed']} parsed, "
            f"{r['cut_off']} cut off"
        )
        for row in r["rows"]:
            print("   ", row["accepted"], row["phase"], repr(row["raw"][:110]), row.get("why", ""))
    Path("/tmp/server_grammar_measure.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
