"""An in-process transformers backend: a local causal LM (a model directory or a GGUF file).

Needs the ``[hf]`` extra (``pip install torch==2.13.0`` then ``pip install 'gpumarket[hf]'``);
torch and transformers are imported only when a backend is built, so ``import agents`` works
without them.

Decoding is a small loop of its own over the model's KV cache rather than ``generate()``:
``generate()`` samples from torch's global RNG, and a backend must not touch global random state.
Greedy decoding is the default (``temperature`` 0 or absent); ``temperature > 0`` samples with a
``torch.Generator`` seeded from the call's ``seed`` (or the backend's own generator, seeded once
from the constructor's ``seed``). ``top_p``, ``top_k`` and ``repetition_penalty`` apply as in
transformers. Sampling draws on the CPU, so a seed gives the same draws on any device for the
same logits (GPU logits themselves may differ slightly from CPU ones).

Structured output: decoding is **not** constrained to the whole JSON schema (no grammar engine;
the caller, e.g. :class:`~agents.llm.agent.LLMAgent`, extracts and repairs the JSON). With a schema and
``json_prefix`` on (the default) the backend guides the model instead: the reply is started with
``{``; when alternatives of the schema require a key fixed to string constants (the
discriminator ``action_type`` for actions) the prefix also holds ``"KEY": "`` and decoding is
constrained to spell one of those constants (e.g. a legal action type), see
:func:`agents.llm.backends.guided.schema_guide`. Decoding stops as soon as that top-level object closes. The returned text
includes the prefix, so it is the whole object. Without a schema the model writes free text.

One model instance is not re-entrant: calls on a model are serialised by a lock (shared by every
backend on the same loaded model, see ``share_model``). ``acomplete`` runs the call in a worker
thread; if the awaiting task is cancelled (e.g. an agent timeout) the decoding loop stops at its
next token.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.llm.backends.base import BackendError, Completion
from agents.llm.backends.guided import json_object_end, schema_guide

TORCH_PIN = "torch==2.13.0"
INSTALL_HINT = (
    f"the in-process HF backend needs the [hf] extra: pip install '{TORCH_PIN}' first (the CPU "
    "build), then pip install 'gpumarket[hf]'"
)
_REQUIRED_MODULES = ("torch", "transformers")
_GGUF_HINT = "loading a .gguf file also needs the gguf package (pip install 'gpumarket[hf]')"


#: request parameters this backend cannot honour (dropped and listed in ``extra["degraded"]``)
UNSUPPORTED: tuple[str, ...] = ("tools", "tool_choice", "reasoning_effort", "logprobs")


def _missing_modules(names: tuple[str, ...]) -> list[str]:
    missing = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


def require_hf_extra(gguf: bool = False) -> None:
    """Raise ``ModuleNotFoundError`` with the install line when the [hf] extra is missing."""
    missing = _missing_modules(_REQUIRED_MODULES + (("gguf",) if gguf else ()))
    if missing:
        hint = f"{INSTALL_HINT}; {_GGUF_HINT}" if missing == ["gguf"] else INSTALL_HINT
        raise ModuleNotFoundError(f"missing {', '.join(missing)}: {hint}", name=missing[0])


def resolve_model_path(path: str | Path, gguf_file: str | None = None) -> tuple[str, str | None]:
    """``(directory or Hub id, gguf file name or None)`` from a directory, .gguf path or Hub id."""
    p = Path(path).expanduser()
    if p.is_file():
        if gguf_file is not None and gguf_file != p.name:
            raise ValueError(f"path {str(p)!r} is a file but gguf_file={gguf_file!r} is another")
        if p.suffix.lower() != ".gguf":
            raise ValueError(
                f"path {str(p)!r} is a file but not a .gguf; pass a model directory or a .gguf file"
            )
        return str(p.parent.resolve()), p.name
    if p.is_dir():
        if gguf_file is not None and not (p / gguf_file).is_file():
            raise ValueError(f"gguf_file {gguf_file!r} is not in {str(p)!r}")
        return str(p.resolve()), gguf_file
    if str(path).lower().endswith(".gguf") or p.is_absolute() or str(path).startswith((".", "~")):
        raise ValueError(f"model path {str(path)!r} does not exist")
    return str(path), gguf_file  # a Hub model id: loads from the local cache or the Hub


@dataclass
class _LoadedModel:
    """A model and tokenizer with the lock that serialises calls on them."""

    model: Any
    tokenizer: Any
    device: Any
    eos_ids: frozenset[int]
    max_positions: int | None
    cache_arg: str = "past_key_values"  # transformers 5 renamed the KV-cache argument "cache"
    lock: threading.Lock = field(default_factory=threading.Lock)
    _token_texts: dict[str, list[int]] | None = None
    async_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = field(
        default_factory=weakref.WeakKeyDictionary
    )

    def token_texts(self) -> dict[str, list[int]]:
        """Text -> ids of the tokens that decode to it (built once, on first constrained call)."""
        if self._token_texts is None:
            texts: dict[str, list[int]] = {}
            special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
            for i in range(len(self.tokenizer)):
                if i not in special:
                    texts.setdefault(self.tokenizer.decode([i]), []).append(i)
            self._token_texts = texts
        return self._token_texts

    def step(self, input_ids: Any, cache: Any) -> Any:
        """One forward pass; returns the model output (logits and the updated KV cache)."""
        kwargs = {} if cache is None else {self.cache_arg: cache}
        return self.model(input_ids=input_ids, use_cache=True, **kwargs)

    def cache_of(self, out: Any) -> Any:
        return out.cache if self.cache_arg == "cache" else out.past_key_values

    def async_lock(self) -> asyncio.Lock:
        """A per-event-loop lock, so waiting coroutines do not each hold a worker thread."""
        loop = asyncio.get_running_loop()
        with _ASYNC_LOCKS_GUARD:
            lock = self.async_locks.get(loop)
            if lock is None:
                lock = self.async_locks[loop] = asyncio.Lock()
        return lock


_ASYNC_LOCKS_GUARD = threading.Lock()
_CACHE_GUARD = threading.Lock()
_MODEL_CACHE: dict[tuple[Any, ...], _LoadedModel] = {}


def clear_model_cache() -> int:
    """Drop the shared loaded models (freed once no backend holds them); returns how many."""
    with _CACHE_GUARD:
        n = len(_MODEL_CACHE)
        _MODEL_CACHE.clear()
    return n


class _Cancelled(Exception):
    """The awaiting coroutine was cancelled; the worker thread stops decoding."""


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Consume the outcome of a worker whose caller may have gone (no 'never retrieved' noise)."""
    if not task.cancelled():
        task.exception()


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

    The model loads on first use (or with :meth:`load`); with ``share_model`` (default) backends
    with the same (path, gguf_file, device, dtype) share one loaded model and its lock, so an agent
    factory per episode does not load the weights again. Loading failures raise ``BackendError``.
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
        json_prefix: bool = True,
        share_model: bool = True,
        trust_remote_code: bool = False,
        preload: bool = False,
    ) -> None:
        if int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if timeout is not None and float(timeout) <= 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout}")
        self.source, self.gguf_file = resolve_model_path(path, gguf_file)
        require_hf_extra(gguf=self.gguf_file is not None)
        self.path = str(path)
        self.device = str(device)
        self.dtype = dtype
        self.max_new_tokens = int(max_new_tokens)
        self.params = dict(params or {})
        self.seed = None if seed is None else int(seed)  # spec strings arrive as text
        self.timeout = None if timeout is None else float(timeout)
        self.json_prefix = bool(json_prefix)
        self.share_model = bool(share_model)
        self.trust_remote_code = bool(trust_remote_code)
        default_name = Path(self.gguf_file).stem if self.gguf_file else Path(self.source).name
        self.model = str(model_name or default_name)
        self._loaded: _LoadedModel | None = None
        self._load_error: str | None = None
        self._init_lock = threading.Lock()
        self._generator: Any = None
        self.calls = 0
        if preload:
            self.load()

    # --- loading ---------------------------------------------------------------------------
    def _dtype_name(self) -> str | None:
        if self.dtype is None:
            return None
        return self.dtype if isinstance(self.dtype, str) else str(self.dtype).removeprefix("torch.")

    def _cache_key(self) -> tuple[Any, ...]:
        return (
            self.source,
            self.gguf_file,
            self.device,
            self._dtype_name(),
            self.trust_remote_code,
        )

    def load(self) -> HFBackend:
        """Load the tokenizer and weights now (otherwise the first call does). Idempotent."""
        self._get_loaded()
        return self

    def _get_loaded(self) -> _LoadedModel:
        if self._loaded is not None:
            return self._loaded
        with self._init_lock:
            if self._loaded is not None:
                return self._loaded
            if self._load_error is not None:  # do not retry a slow failing load on every call
                raise BackendError(self._load_error)
            key = self._cache_key()
            if self.share_model:
                with _CACHE_GUARD:
                    loaded = _MODEL_CACHE.get(key)
                if loaded is None:
                    loaded = self._load_model()
                    with _CACHE_GUARD:
                        loaded = _MODEL_CACHE.setdefault(key, loaded)
            else:
                loaded = self._load_model()
            self._loaded = loaded
            return loaded

    def _load_model(self) -> _LoadedModel:
        where = f"{self.source}" + (f" (gguf_file={self.gguf_file})" if self.gguf_file else "")
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ModuleNotFoundError(f"{INSTALL_HINT} ({exc})", name=exc.name) from None
        error: str | None = None
        try:
            kwargs: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
            if self.gguf_file:
                kwargs["gguf_file"] = self.gguf_file
            tokenizer = AutoTokenizer.from_pretrained(self.source, **kwargs)
            model_kwargs = dict(kwargs)
            if self.dtype is not None:
                named = isinstance(self.dtype, str) and self.dtype != "auto"
                model_kwargs["dtype"] = getattr(torch, self.dtype) if named else self.dtype
            model = AutoModelForCausalLM.from_pretrained(self.source, **model_kwargs)
            device = torch.device(self.device)
            model.to(device)
            model.eval()
            eos: set[int] = set()
            config_eos = getattr(model.generation_config, "eos_token_id", None)
            for value in (tokenizer.eos_token_id, config_eos):
                if isinstance(value, int):
                    eos.add(value)
                elif isinstance(value, list | tuple):
                    eos.update(int(v) for v in value)
            max_positions = getattr(model.config, "max_position_embeddings", None)
            cache_arg = (
                "cache"
                if "cache" in inspect.signature(model.forward).parameters
                else ("past_key_values")
            )
            return _LoadedModel(
                model=model,
                tokenizer=tokenizer,
                device=device,
                eos_ids=frozenset(eos),
                max_positions=int(max_positions) if max_positions else None,
                cache_arg=cache_arg,
            )
        except ImportError as exc:  # e.g. gguf missing, raised by transformers at load time
            error = f"cannot load {where}: {exc}; {INSTALL_HINT}"
        except Exception as exc:  # mapped below, outside the handler, so no chained context
            error = f"cannot load {where}: {type(exc).__name__}: {exc}"
        self._load_error = error[:2000]
        raise BackendError(self._load_error)

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

    def _guide(self, schema: dict[str, Any] | None) -> tuple[str, list[str] | None]:
        if schema is None or not self.json_prefix:
            return "", None
        prefix, values = schema_guide(schema)
        # the JSON spelling of each allowed value, closed by its quote
        return prefix, None if values is None else [json.dumps(v)[1:] for v in values]

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

    def _sampler(self, p: dict[str, Any]) -> Callable[[Any], int]:
        """A function from the next-token logits (1-D float tensor) to the chosen token id."""
        import torch

        temperature = float(p.get("temperature") or 0.0)
        if temperature <= 0.0:
            return lambda logits: int(torch.argmax(logits).item())
        if p.get("seed") is not None:
            gen = torch.Generator().manual_seed(int(p["seed"]))
        else:
            if self._generator is None:
                self._generator = torch.Generator()
                if self.seed is None:
                    self._generator.seed()
                else:
                    self._generator.manual_seed(int(self.seed))
            gen = self._generator
        top_k = int(p.get("top_k") or 0)
        top_p = float(p.get("top_p") if p.get("top_p") is not None else 1.0)

        def sample(logits: Any) -> int:
            scores = logits.float().cpu() / temperature
            if 0 < top_k < scores.numel():
                kth = torch.topk(scores, top_k).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            if top_p < 1.0:
                sorted_scores, order = torch.sort(scores, descending=True)
                sorted_probs = torch.softmax(sorted_scores, dim=-1)
                drop = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p  # always keeps the first
                scores = scores.index_fill(0, order[drop], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            return int(torch.multinomial(probs, 1, generator=gen).item())

        return sample

    def _generate(
        self,
        loaded: _LoadedModel,
        messages: list[dict[str, Any]],
        schema: dict[str, Any] | None,
        params: dict[str, Any],
        cancel: threading.Event | None,
    ) -> Completion:
        import torch

        p = self._call_params(params)
        tokenizer = loaded.tokenizer
        prefix, pending = self._guide(schema)
        prompt = self._render(tokenizer, messages) + prefix
        prompt_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        n_prompt = int(prompt_ids.shape[1])
        max_new = int(p["max_new_tokens"])
        if loaded.max_positions:
            if n_prompt >= loaded.max_positions:
                raise BackendError(
                    f"model {self.model}: the prompt has {n_prompt} tokens; the "
                    f"model's context is {loaded.max_positions}"
                )
            max_new = min(max_new, loaded.max_positions - n_prompt)
        sample = self._sampler(p)
        penalty = float(p.get("repetition_penalty") or 1.0)
        timeout = p.get("timeout", self.timeout)
        deadline = None if timeout is None else time.perf_counter() + float(timeout)
        generated: list[int] = []
        text, finish, stopped_by = "", "length", None
        with torch.inference_mode():
            out = loaded.step(prompt_ids.to(loaded.device), None)
            for _ in range(max_new):
                logits = out.logits[0, -1, :]
                if penalty != 1.0 and generated:
                    seen = torch.tensor(sorted(set(generated)), device=logits.device)
                    picked = logits[seen]
                    logits = logits.clone()
                    logits[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
                if pending is not None:  # still spelling the discriminator value
                    allowed = self._allowed_tokens(loaded, text, pending)
                    if allowed:
                        index = torch.tensor(allowed, device=logits.device)
                        logits = torch.full_like(logits, float("-inf")).index_copy(
                            0, index, logits[index]
                        )
                    else:
                        pending = None
                token = sample(logits)
                if token in loaded.eos_ids:
                    finish = "stop"
                    break
                generated.append(token)
                text = tokenizer.decode(generated, skip_special_tokens=True)
                if pending is not None and (
                    text in pending or not any(v.startswith(text) for v in pending)
                ):
                    pending = None  # the value is complete (or the tokenizer spelled it oddly)
                if prefix:
                    end = json_object_end(prefix + text)
                    if end is not None:
                        text = (prefix + text)[:end][len(prefix) :]
                        finish, stopped_by = "stop", "json"
                        break
                hit = min((i for i in (text.find(s) for s in p["stop"]) if i >= 0), default=-1)
                if hit >= 0:
                    text, finish, stopped_by = text[:hit], "stop", "stop_sequence"
                    break
                if cancel is not None and cancel.is_set():
                    raise _Cancelled
                if deadline is not None and time.perf_counter() > deadline:
                    raise BackendError(
                        f"model {self.model}: timed out after {float(timeout):g}s "
                        f"({len(generated)} tokens generated)"
                    )
                step = torch.tensor([[token]], device=loaded.device)
                out = loaded.step(step, loaded.cache_of(out))
        extra: dict[str, Any] = {"finish_reason": finish, "device": str(loaded.device)}
        if prefix:
            extra["prefix"] = prefix
        if stopped_by:
            extra["stopped_by"] = stopped_by
        return Completion(
            text=prefix + text,
            model=self.model,
            prompt_tokens=n_prompt,
            completion_tokens=len(generated),
            extra=extra,
        )

    @staticmethod
    def _allowed_tokens(loaded: _LoadedModel, text: str, pending: list[str]) -> list[int]:
        """Tokens that keep ``text`` a prefix of one of the ``pending`` spellings."""
        texts = loaded.token_texts()
        allowed: set[int] = set()
        for value in pending:
            if value.startswith(text):
                rest = value[len(text) :]
                for k in range(1, len(rest) + 1):
                    allowed.update(texts.get(rest[:k], ()))
        return sorted(allowed)

    def _run(
        self,
        messages: list[dict[str, Any]],
        schema: dict[str, Any] | None,
        params: dict[str, Any],
        cancel: threading.Event | None = None,
    ) -> Completion:
        error: str | None = None
        loaded = self._get_loaded()  # raises BackendError (or ModuleNotFoundError) itself
        queued = time.perf_counter()
        with loaded.lock:
            start = time.perf_counter()
            try:
                if cancel is not None and cancel.is_set():
                    raise _Cancelled
                self.calls += 1
                completion = self._generate(loaded, messages, schema, params, cancel)
            except (BackendError, _Cancelled):
                raise
            except Exception as exc:  # torch/tokenizer errors, out of memory...; mapped below
                error = f"model {self.model}: generation failed: {type(exc).__name__}: {exc}"[:2000]
            else:
                latency = time.perf_counter() - start
                extra = {**completion.extra, "queue_s": start - queued}
                dropped = [k for k in UNSUPPORTED if params.get(k) is not None]
                if dropped:  # recorded, never silent: the agent counts these
                    extra["degraded"] = [
                        f"{k} not supported by the hf backend: not used" for k in dropped
                    ]
                return Completion(
                    text=completion.text,
                    model=completion.model,
                    prompt_tokens=completion.prompt_tokens,
                    completion_tokens=completion.completion_tokens,
                    latency_s=latency,
                    extra=extra,
                )
        raise BackendError(error)

    def complete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        return self._run(messages, schema, params or {})

    async def acomplete(
        self, messages: list[dict[str, Any]], schema: dict[str, Any] | None, params: dict[str, Any]
    ) -> Completion:
        loaded = await asyncio.to_thread(self._get_loaded)
        cancel = threading.Event()
        async with loaded.async_lock():
            work = asyncio.to_thread(self._run, messages, schema, params or {}, cancel)
            task = asyncio.ensure_future(work)
            task.add_done_callback(_retrieve)
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                cancel.set()  # the worker thread stops at its next token and releases the model
                raise

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
            f"device={self.device!r}, max_new_tokens={self.max_new_tokens})"
        )

    __str__ = __repr__

    def __getstate__(self) -> dict[str, Any]:
        # picklable for process pools: the model reloads (once per process) on the other side
        state = self.__dict__.copy()
        state.update(_loaded=None, _init_lock=None, _generator=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_lock = threading.Lock()
