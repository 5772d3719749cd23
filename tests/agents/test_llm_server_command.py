"""The llama.cpp server command that docs/llm-seats.md documents works: this test reads the command
and the seat spec from the page, starts the server with exactly those flags (only the model path,
the port and the Python interpreter are filled in), and plays a short episode against it with
SmolLM2-135M. Every decision's first prompt fits the documented context with room for the reply."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from real_model_utils import (
    LLAMA_INSTALL,
    LLAMA_SERVER_MODULES,
    check_llm_seat,
    free_port,
    recording,
    require_gguf,
    require_modules,
)

from agents.registry import make_agent
from market.run.rollout import run_episode

DOC = Path(__file__).resolve().parents[2] / "docs" / "llm-seats.md"
SECTION = "## A small local model on llama.cpp"


def documented() -> tuple[list[str], str]:
    """The server command (argv) and the seat spec of the page's llama.cpp section."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", 1)]
    command = re.search(r"```bash\n(.*?)```", section, re.S)
    spec = re.search(r"```text\n(llm:.*?)\n```", section, re.S)
    assert command and spec, "the section must show the server command and the seat spec"
    return shlex.split(command.group(1).replace("\\\n", " ")), spec.group(1).strip()


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_documented_command_has_the_flags_the_page_explains() -> None:
    argv, spec = documented()
    assert argv[:3] == ["python", "-m", "llama_cpp.server"]
    assert flag(argv, "--n_ctx") == "2048"
    assert flag(argv, "--chat_format") == "chatml"
    assert flag(argv, "--interrupt_requests") == "False"
    assert int(flag(argv, "--n_threads")) >= 1
    params = dict(p.split("=", 1) for p in spec.split("?", 1)[1].split("&"))
    assert params["response_format"] == "json_object"
    assert float(params["timeout"]) >= 120 and int(params["max_tokens"]) == 384
    # memory keeps each request within context - max_tokens (the server refuses more)
    assert params["context"] == flag(argv, "--n_ctx")
    assert params["base_url"] == f"http://127.0.0.1:{flag(argv, '--port')}/v1"
    assert params["model"] == flag(argv, "--model_alias")


@pytest.mark.slow
@pytest.mark.real_model
def test_documented_server_command_plays_an_episode(tmp_path: Path) -> None:
    require_modules(LLAMA_SERVER_MODULES, LLAMA_INSTALL)
    model = require_gguf()
    argv, spec = documented()
    port = free_port()
    doc_port = flag(argv, "--port")
    argv = [sys.executable, *argv[1:]]
    argv[argv.index("--model") + 1] = str(model)
    argv[argv.index("--port") + 1] = str(port)
    # the other pytest worker keeps a core busy: ggml's spinning threads on an oversubscribed CPU
    # ran 100x slower in CI (0.36 tokens/s), so the test server takes one thread
    argv[argv.index("--n_threads") + 1] = "1"
    spec = spec.replace(f"127.0.0.1:{doc_port}/", f"127.0.0.1:{port}/")
    log = tmp_path / "llama_server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 180
            while True:
                assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                try:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/v1/models", timeout=2
                    ) as r:
                        if json.loads(r.read()).get("data"):
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "server not ready in 180 s"
                time.sleep(0.3)
            agent = recording(make_agent(spec))
            result = run_episode(
                "single_trade", seed=0, seats={"bidder_0": agent}, agent_timeout=900
            )
            summary = check_llm_seat(result, "bidder_0", agent)
            n_ctx = int(flag(argv, "--n_ctx"))
            first_prompts = [
                ex for ex in agent.exchanges if ex["attempts"] == 1 and not ex["fallback"]
            ]
            # no first-turn request overflowed the context (the server would refuse it)
            for ex in agent.exchanges:
                if ex["attempts"] == 1:
                    assert "context" not in str(ex["error"] or "").lower(), ex["error"]
            assert first_prompts, summary
            assert summary["parsed"] >= 1, summary
            per_request = summary["prompt_tokens"] / summary["requests"]
            assert per_request + 384 <= n_ctx, summary
            assert proc.poll() is None, "the server died during the episode"
            print("documented llama.cpp command:", summary)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
