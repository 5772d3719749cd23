"""An in-process transformers backend: a local causal LM (a model directory or a GGUF file).

Needs the ``[hf]`` extra (``pip install torch==2.13.0`` then ``pip install 'gpumarket[hf]'``);
torch and transformers are imported only when a backend is built, so ``import agents`` works
without them.

Decoding goes through :class:`~agents.llm.backends.hf_engine.BatchEngine`: one engine per loaded
model gathers the calls of every backend, seat and episode on that model into batches (a short
time window, up to ``max_batch`` rows) and decodes each batch with transformers' ``generate``.
With a schema (``constrain`` on, the default) decoding is constrained by an ``xgrammar`` grammar
of the whole JSON schema, so the reply is valid JSON of the schema (for an agent: a legal action)
unless it is cut off by the token limit; it stops as soon as the object closes. Without a schema
the model writes free text up to an end token or a stop string.

Greedy decoding is the default (``temperature`` 0 or absent); ``temperature > 0`` samples with a
``torch.Generator`` seeded from the call's ``seed`` (or the backend's own generator, seeded once
from the constructor's ``seed``). ``top_p``, ``top_k`` and ``repetition_penalty`` apply per call.
Sampling draws on the CPU, so a seed gives the same draws on any device for the same logits.
What is reproducible: the same seed gives the same tokens on the same device with the same batch
composition; another device or batch size can change the logits' last bits (docs/llm-seats.md).

``acomplete`` awaits the engine without holding a thread; if the awaiting task is cancelled (an
agent timeout) its row stops at its next token and the rest of the batch goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
from pathlib import Path
from typing import Any

from agents.llm.backends.base import BackendError, Completion, expected_call
from agents.llm.backends.hf_engine import (
    DEFAULT_MAX_BATCH,
    DEFAULT_WINDOW_S,
    BatchEngine,
    EngineCancelled,
    Expectation,
    GenerationRequest,
    GenerationResult,
)
from agents.llm.backends.hf_engine import (
    mask_threads as engine_mask_threads,
)
from agents.llm.backends.hf_loading import (
    LOAD_LOCK,
    LoadedModel,
    ModelKey,
    load_model,
    require_hf_extra,
)
from agents.llm.backends.hf_threads import apply_threads, check_threads


def adapter_digest(folder: str | Path) -> str:
    """12 hex digits of the sha256 of an adapter folder's weights and config (names a model)."""
    h = hashlib.sha256()
    for p in sorted(Path(folder).iterdir()):
        if p.is_file() and (
            p.suffix in (".safetensors", ".bin") or p.name == "adapter_config.json"
        ):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


#: the time limit of one decision of an ``llm:hf`` seat decoding on the CPU when the run sets none
#: (the scenario's default, 120 s, is for model servers and scripted seats): a decision is up to
#: ``retries + 1`` replies of up to ``max_tokens`` tokens after a prompt of up to ``context``
#: tokens, at a few tokens a second on a busy CPU (docs/llm-seats.md gives the measurements)
CPU_DECISION_TIMEOUT_S = 900.0
#: the degraded note of a model without a chat template (its prompts are plain text)
NO_TEMPLATE = (
    "no chat template: the model has none, so its prompts were rendered as plain "
    "'role: content' turns it was not trained on"
)
#: request parameters this backend cannot honour (dropped and listed in ``extra["degraded"]``)
UNSUPPORTED: tuple[str, ...] = ("tools", "tool_choice", "reasoning_effort", "logprobs")


def engine_of(
    loaded: LoadedModel,
    max_batch: int,
    window_s: float,
    static_cache: bool = False,
    fused_kernels: bool | None = None,
    mask_threads: int | None = None,
) -> BatchEngine:
    """The one engine of a loaded model (made by the first caller, with its batch settings)."""
    # the engine imports xgrammar and transformers' generation classes: not while another thread
    # loads a model (lazy imports are not thread-safe, see hf_loading)
    with LOAD_LOCK, loaded.state_lock:
        engine: BatchEngine | None = loaded.state.get("engine")
        if engine is None:
            engine = loaded.state["engine"] = BatchEngine(
                loaded.model,
                loaded.tokenizer,
                loaded.device,
                loaded.eos_ids,
                loaded.vocab_size,
                max_batch=max_batch,
                window_s=window_s,
                static_cache=static_cache,
                fused=fused_kernels,
                threads=mask_threads,
            )
        return engine


class HFBackend:
    """A local causal LM run in-process with transformers (see the module docstring).

    ``path`` is a model directory, a ``.gguf`` file (``gguf_file`` is then its name) or a Hub id
    (loaded from the local Hub cache; set ``HF_HUB_OFFLINE=1`` to forbid downloads). ``device`` is
    a torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``); ``dtype`` a torch dtype or its
    name (``"float32"``, ``"bfloat16"``; None: the checkpoint's, float32 for a dequantised GGUF).
    ``max_new_tokens`` caps each reply (a call's ``max_tokens``/``max_new_tokens`` overrides it);
    ``timeout`` (seconds, None: no limit) bounds one call's decoding and raises
    :class:`BackendError` when exceeded. ``params`` are default sampling parameters merged under
    each call's. ``seed`` seeds the backend's generator for sampled calls without a ``seed``.
    ``constrain`` (default on) decodes calls with a schema under its grammar. ``max_batch`` and
    ``batch_window_ms`` set how the model's engine batches concurrent calls, and
    ``static_cache`` makes it decode into preallocated KV caches, its step captured as a CUDA
    graph on a GPU (see ``hf_decode``). ``fused_kernels`` rewrites the model's norms, rotary
    embedding and MLPs into fewer kernels where they give the same result (``hf_fused``; None:
    on a GPU only). The first backend to use a loaded model sets these for every backend sharing
    it. ``quantize="int8"`` runs the linear layers as int8 products on the CPU: about twice the
    tokens a second, at a cost in fidelity (``hf_quantize`` gives the figures; default none).
    ``mask_threads`` writes a step's grammar masks on up to that many threads, one per row at
    most (None: the cores, at most 16; 1: row by row). ``adapter`` is a PEFT LoRA adapter
    folder (e.g. from ``gpumarket train-llm``), merged into the weights when the model loads
    (needs ``peft``); the default model name then ends ``+lora-<12 hex of its weights' sha256>``.
    ``threads`` sets torch's CPU threads when the model loads (None: one share of the cores per
    CPU model loaded, :mod:`.hf_threads`). A seat on the CPU gets
    :data:`CPU_DECISION_TIMEOUT_S` per decision unless the run sets a limit
    (:attr:`decision_timeout`); a model without a chat template notes it in every reply's
    ``extra["degraded"]``.

    The model loads on first use (or with :meth:`load`); with ``share_model`` (default) backends
    with the same (path, gguf_file, device, dtype) share one loaded model and its engine, so an
    agent factory per episode does not load the weights again and every seat on the model shares
    its batches (backends asking for another ``quantize`` mode load their own copy). Loading
    failures raise ``BackendError``.
    """

    def __init__(
        self,
        path: str | Path,
        gguf_file: str | None = None,
        device: str = "cpu",
        max_new_tokens: int = 256,
        dtype: Any = None,
        *,
        model_name: str | None = None,
        params: dict[str, Any] | None = None,
        seed: int | None = None,
        timeout: float | None = None,
        constrain: bool = True,
        max_batch: int = DEFAULT_MAX_BATCH,
        batch_window_ms: float = DEFAULT_WINDOW_S * 1000,
        static_cache: bool = False,
        fused_kernels: bool | None = None,
        quantize: str | None = None,
        mask_threads: int | None = None,
        share_model: bool = True,
        trust_remote_code: bool = False,
        preload: bool = False,
        adapter: str | Path | None = None,
        threads: int | None = None,
    ) -> None:
        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if timeout is not None and float(timeout) <= 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout}")
        self.key = ModelKey.of(path, gguf_file, device, dtype, trust_remote_code, quantize, adapter)
        self.source, self.gguf_file = self.key.source, self.key.gguf_file
        require_hf_extra(gguf=self.gguf_file is not None)
        self.path = str(path)
        self.device = str(device)
        self.dtype = dtype
        self.max_new_tokens = int(max_new_tokens)
        self.params = dict(params or {})
        self.seed = None if seed is None else int(seed)  # spec strings arrive as text
        self.timeout = None if timeout is None else float(timeout)
        self.constrain = bool(constrain)
        if int(max_batch) < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if float(batch_window_ms) < 0:
            raise ValueError(f"batch_window_ms must be 0 or more, got {batch_window_ms}")
        self.max_batch = int(max_batch)
        self.batch_window_ms = float(batch_window_ms)
        self.static_cache = bool(static_cache)
        self.fused_kernels = None if fused_kernels is None else bool(fused_kernels)
        # checked now (the engine is made later, by the first call); None: the engine's default
        self.mask_threads = None if mask_threads is None else engine_mask_threads(mask_threads)
        self.threads = None if threads is None else check_threads(threads)
        self.cpu_threads: int | None = None  # torch's CPU threads, set when the model loads
        self.share_model = bool(share_model)
        self.trust_remote_code = bool(trust_remote_code)
        default_name = Path(self.gguf_file).stem if self.gguf_file else Path(self.source).name
        self.adapter = self.key.adapter
        if self.adapter:  # another adapter is another model (the response cache's key)
            default_name = f"{default_name}+lora-{adapter_digest(self.adapter)}"
        self.model = str(model_name or default_name)
        self._loaded: LoadedModel | None = None
        self._generator: Any = None
        self.calls = 0
        if preload:
            self.load()

    @property
    def decision_timeout(self) -> float | None:
        """The time limit a decision of a seat on this backend needs when the run sets none:
        :data:`CPU_DECISION_TIMEOUT_S` on the CPU, None (the run's default) elsewhere."""
        return CPU_DECISION_TIMEOUT_S if self.device.split(":")[0] == "cpu" else None

    # --- loading ---------------------------------------------------------------------------
    def load(self) -> HFBackend:
        """Load the tokenizer and weights now (otherwise the first call does). Idempotent."""
        self._get_loaded()
        return self

    @property
    def loaded(self) -> LoadedModel:
        """The loaded model (loading it now if needed): its device, ``quantize`` mode, notes."""
        return self._get_loaded()

    def _get_loaded(self) -> LoadedModel:
        """The loaded model (once per process per key, see :mod:`.hf_loading`); a load failure
        is a :class:`BackendError` (a ``ModelLoadError``) with the user's fix."""
        if self._loaded is None:
            loaded = load_model(self.key, shared=self.share_model)
            self.cpu_threads = apply_threads(self.threads, loaded.model, self.device)
            self._loaded = loaded
        return self._loaded

    # --- prompting -------------------------------------------------------------------------
    def _render(self, tokenizer: Any, messages: list[dict[str, Any]]) -> str:
        """The chat template applied with the generation prompt (a plain rendering without one)."""

        def apply(turns: list[dict[str, str]]) -> str:
            return str(
                tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
            )

        if getattr(tokenizer, "chat_template", None):
            try:
                return apply(messages)
            except Exception:
                # some templates (e.g. Gemma's) reject a system turn: fold it into the first user's
                system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system")
                rest = [dict(m) for m in messages if m.get("role") != "system"]
                if not system or not rest or rest[0].get("role") != "user":
                    raise
                rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
                return apply(rest)
        lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
        return "\n\n".join(lines) + "\n\nassistant: "

    # --- decoding --------------------------------------------------------------------------
    def _call_params(self, params: dict[str, Any]) -> dict[str, Any]:
        merged = {**self.params, **{k: v for k, v in params.items() if v is not None}}
        max_new = next(
            (
                merged[k]
                for k in ("max_new_tokens", "max_tokens", "max_completion_tokens")
                if merged.get(k) is not None
            ),
            None,
        )
        merged["max_new_tokens"] = self.max_new_tokens if max_new is None else int(max_new)
        if merged["max_new_tokens"] < 1:
            raise BackendError(f"max_tokens must be at least 1, got {merged['max_new_tokens']}")
        stop = merged.get("stop")
        merged["stop"] = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        return merged

    def _generator_for(self, p: dict[str, Any]) -> Any:
        """The torch generator of a sampled call: its own seed, else the backend's stream."""
        import torch

        if float(p.get("temperature") or 0.0) <= 0.0:
            return None
        if p.get("seed") is not None:
            return torch.Generator().manual_seed(int(p["seed"]))
        if self._generator is None:
            self._generator = torch.Generator()
            if self.seed is None:
                self._generator.seed()
            else:
                self._generator.manual_seed(int(self.seed))
        return self._generator

    def _request(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> tuple[BatchEngine, GenerationRequest]:
        """Render and tokenise the prompt and describe the call for the engine."""
        loaded = self._get_loaded()  # raises BackendError (or ModuleNotFoundError) itself
        p = self._call_params(params)
        prompt = self._render(loaded.tokenizer, messages)
        ids = loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        max_new = int(p["max_new_tokens"])
        if loaded.max_positions:
            if len(ids) >= loaded.max_positions:
                raise BackendError(
                    f"model {self.model}: the prompt has {len(ids)} tokens but the model's "
                    f"context is {loaded.max_positions}; shorten the prompt (e.g. the seat's "
                    "memory=window:N) or use a model with a longer context"
                )
            max_new = min(max_new, loaded.max_positions - len(ids))
        timeout = p.get("timeout", self.timeout)
        top_p = p.get("top_p")
        request = GenerationRequest(
            prompt_ids=list(ids),
            max_new=max_new,
            schema=schema if self.constrain else None,
            temperature=float(p.get("temperature") or 0.0),
            top_k=int(p.get("top_k") or 0),
            top_p=float(top_p if top_p is not None else 1.0),
            repetition_penalty=float(p.get("repetition_penalty") or 1.0),
            generator=self._generator_for(p),
            stop=p["stop"],
            timeout=None if timeout is None else float(timeout),
            expectation=expected_call(),
        )
        engine = engine_of(
            loaded,
            self.max_batch,
            self.batch_window_ms / 1000.0,
            self.static_cache,
            self.fused_kernels,
            self.mask_threads,
        )
        return engine, request

    def expect(self) -> Expectation | None:
        """Announce a call about to come, so the engine's next batch waits for it (see
        ``agents.llm.backends.base.announced``); None before the first call made the engine."""
        engine = self._loaded.state.get("engine") if self._loaded is not None else None
        return engine.expect() if engine is not None else None

    def _submit(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> tuple[GenerationRequest, concurrent.futures.Future[GenerationResult]]:
        engine, request = self._request(messages, schema, params)
        try:
            future = engine.submit(request)
        except Exception as exc:  # e.g. a schema xgrammar cannot compile
            raise BackendError(
                f"model {self.model}: cannot constrain decoding to the schema: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        self.calls += 1
        return request, future

    def _completion(
        self, request: GenerationRequest, outcome: GenerationResult, params: dict[str, Any]
    ) -> Completion:
        extra: dict[str, Any] = {
            "finish_reason": outcome.finish,
            "device": self.device,
            "batch": outcome.batch,
            "queue_s": outcome.queue_s,
        }
        if outcome.stopped_by:
            extra["stopped_by"] = outcome.stopped_by
        degraded = [
            f"{k} not supported by the hf backend: not used"
            for k in UNSUPPORTED
            if params.get(k) is not None
        ]
        if self._loaded is not None:
            degraded.extend(self._loaded.notes)  # e.g. a conversion cache that was not written
            if not getattr(self._loaded.tokenizer, "chat_template", None):
                degraded.append(NO_TEMPLATE)
        if self.cpu_threads is not None:
            extra["threads"] = self.cpu_threads
        if degraded:  # recorded, never silent: the agent counts these
            extra["degraded"] = degraded
        return Completion(
            text=outcome.text,
            model=self.model,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(outcome.token_ids),
            latency_s=outcome.decode_s,
            extra=extra,
        )

    def _failure(self, exc: BaseException) -> BackendError:
        if isinstance(exc, TimeoutError):
            return BackendError(f"model {self.model}: {exc}")
        return BackendError(
            f"model {self.model}: generation failed: {type(exc).__name__}: {exc}"[:2000]
        )

    def complete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        params = params or {}
        request, future = self._submit(messages, schema, params)
        try:
            outcome = future.result()
        except EngineCancelled:
            raise BackendError(f"model {self.model}: the call was cancelled") from None
        except Exception as exc:
            raise self._failure(exc) from None
        return self._completion(request, outcome, params)

    async def acomplete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        params = params or {}
        # loading and tokenising can take seconds: not on the event loop
        request, future = await asyncio.to_thread(self._submit, messages, schema, params)
        try:
            outcome = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            request.cancel.set()  # the row stops at its next token; the batch goes on
            raise
        except EngineCancelled:
            raise BackendError(f"model {self.model}: the call was cancelled") from None
        except Exception as exc:
            raise self._failure(exc) from None
        return self._completion(request, outcome, params)

    # --- what this backend can do ----------------------------------------------------------
    def supports_tools(self) -> bool:
        """False: no tool-call decoding here; a seat in ``mode=auto`` uses JSON mode."""
        return False

    async def asupports_tools(self) -> bool:
        return False

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` by the model's own tokenizer (loads the model if needed)."""
        tokenizer = self._get_loaded().tokenizer
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    # --- misc ------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (
            f"HFBackend(path={self.path!r}, gguf_file={self.gguf_file!r}, "
            f"device={self.device!r}, max_new_tokens={self.max_new_tokens}"
            + (f", adapter={self.adapter!r})" if self.adapter else ")")
        )

    __str__ = __repr__

    def __getstate__(self) -> dict[str, Any]:
        # picklable for process pools: the model reloads (once per process) on the other side
        state = self.__dict__.copy()
        state.update(_loaded=None, _generator=None)
        return state
