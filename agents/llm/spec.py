"""LLM seat specs: what ``llm:PROVIDER?key=value&...`` may say and how each value is read.

The agent's own parameters and their converters, the backends each provider names, checking
parameter names (with a did-you-mean) and coercing values to the backend's signature.

``PROVIDER`` is ``openai`` (any OpenAI-compatible server, configured by hand), ``hf``
(transformers in process), ``module:Class``, or a preset of :mod:`agents.llm.providers`
(``vllm``, ``llama.cpp``, ``ollama``, ``groq``...): ``llm:vllm?model=M`` is
``llm:openai?provider=vllm&model=M``, with the preset's base URL, key variable, response format
and capabilities."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agents.base import as_flag, unknown_parameter_message
from agents.llm.backends.base import describe_error
from agents.llm.backends.registry import PROVIDERS, backend_class
from agents.llm.cache import CachedBackend
from agents.llm.memory import parse_memory
from agents.llm.providers import ALIASES, PRESETS
from agents.llm.reasoning import effort_value, reasoning_mode
from agents.llm.tools import tool_mode

# kept importable from here (the backends by name live in agents.llm.backends.registry, the
# unknown-parameter message in agents.base)
__all__ = ["PROVIDERS", "backend_class", "describe_error", "unknown_parameter_message"]


def model_name(params: Mapping[str, Any]) -> str:
    """The model name a backend would report, from spec parameters (offline replay)."""
    for key in ("model_name", "model"):
        if params.get(key):
            return str(params[key])
    path = str(params.get("path") or "")
    if not path:
        raise TypeError("cache_mode=read needs model=... (part of the cache key)")
    p = Path(str(params.get("gguf_file") or path))
    return p.stem if p.suffix == ".gguf" else p.name


def as_bool(value: Any) -> bool:
    return as_flag(value, "value")


def optional(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        return (
            None
            if value is None or str(value).strip().lower() in ("none", "null", "")
            else conv(value)
        )

    return convert


def memory_value(value: Any) -> str:
    """A checked ``memory=`` value (none, full, window:N, summary[:N])."""
    parse_memory(str(value))
    return str(value).strip().lower()


AGENT_PARAM_TYPES: dict[str, Callable[[Any], Any]] = {
    "retries": int,
    "fallback": str,
    "temperature": optional(float),
    "max_tokens": optional(int),
    "send_seed": as_bool,
    "structured": as_bool,
    "call_timeout": optional(float),
    "memory": memory_value,
    "context": optional(int),
    "counter": str,
    "reasoning": reasoning_mode,
    "reasoning_effort": effort_value,
    "mode": tool_mode,
    "prompt": optional(str),
    "persona": optional(str),
}
#: every parameter an ``llm:`` spec takes whatever its provider (the backend's come on top)
AGENT_PARAMS: tuple[str, ...] = (
    *AGENT_PARAM_TYPES,
    "price_prompt",
    "price_completion",
    "cache",
    "cache_mode",
)
#: parameters of earlier versions, refused with what to write instead
RENAMED_PARAMS = {
    "cost_prompt": "price_prompt",
    "cost_completion": "price_completion",
}


def price_value(name: str, value: Any) -> float:
    try:
        price = float(value or 0.0)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name}={value!r}: give USD per million tokens as a number, "
            "e.g. price_prompt=0.15&price_completion=0.60"
        ) from None
    if not price >= 0:
        raise TypeError(f"{name}={value!r}: a price cannot be negative")
    return price


def backend_params(backend_cls: type) -> list[str] | None:
    """The parameter names of a backend class's constructor (None: it takes any keyword)."""
    sig = inspect.signature(backend_cls)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return [
        n
        for n, p in sig.parameters.items()
        if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def check_names(backend_cls: type, params: Mapping[str, Any]) -> None:
    """Refuse a parameter neither the agent nor the backend takes, listing both sets."""
    backend = backend_params(backend_cls)
    for key in params:
        if key in RENAMED_PARAMS:
            raise TypeError(
                f"{key} was USD per 1k tokens and is now {RENAMED_PARAMS[key]}, in USD per million "
                f"tokens as providers publish prices and as --price takes them: write "
                f"{RENAMED_PARAMS[key]}=<your {key} x 1000>"
            )
        if key in AGENT_PARAMS or backend is None or key in backend:
            continue
        raise TypeError(
            unknown_parameter_message(
                key, "", {"agent": AGENT_PARAMS, backend_cls.__name__: backend}
            )
        )


def spec_provider(provider: str, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(provider, params) of a spec: ``llm:openai?provider=NAME`` is ``llm:NAME``; a
    ``provider=`` that disagrees with a preset named in the head is refused (TypeError)."""
    out = dict(params)
    given = out.pop("provider", None)
    if given is None:
        return provider, out
    given = str(given)
    if provider in ("", "openai"):
        return given, out
    if ALIASES.get(given, given) != ALIASES.get(provider, provider):
        raise TypeError(
            f"llm:{provider} names a provider but the spec says provider={given}; keep one of them"
        )
    return provider, out


def preset_params(provider: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The backend parameters of ``llm:PROVIDER?...``: a preset name other than ``openai`` adds
    ``provider=NAME`` (a ``provider=`` in the spec must agree with it)."""
    out = dict(params)
    name = ALIASES.get(provider, provider)
    if name in PRESETS and name != "openai":
        given = out.get("provider")
        if given is not None and ALIASES.get(str(given), str(given)) != name:
            raise TypeError(
                f"llm:{provider} names the {name} preset but the spec says provider={given}; "
                "keep one of them"
            )
        out["provider"] = name
    return out


def coerce_params(cls: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """Convert spec strings by the types of ``cls.__init__``'s defaults; unknown names raise TypeError."""
    sig = inspect.signature(cls)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    out: dict[str, Any] = {}
    for key, value in params.items():
        param = sig.parameters.get(key)
        if param is None:
            if accepts_any:
                out[key] = value
                continue
            raise TypeError(
                f"unknown parameter {key!r}; {cls.__name__} takes: "
                f"{', '.join(n for n in sig.parameters if n != 'self')}"
            )
        default = param.default
        if param.annotation in ("str", str) and not isinstance(value, str):
            out[key] = str(value)  # e.g. model=7 coerced to an int by a spec parser
        elif not isinstance(value, str):
            out[key] = value
        elif value.strip().lower() in ("none", "null") and (
            default is None or default is param.empty
        ):
            out[key] = None
        elif isinstance(default, bool) or param.annotation in ("bool | None", "Optional[bool]"):
            out[key] = as_bool(value)
        elif isinstance(default, int):
            out[key] = int(value)
        elif isinstance(default, float):
            out[key] = float(value)
        else:
            out[key] = value
    return out


def agent_arguments(provider: str, params: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """What ``LLMAgent.from_params`` builds from spec parameters: the spec text, the backend
    (wrapped in the response cache when ``cache`` is given) and the agent's keyword arguments.
    Raises ``TypeError``/``ValueError`` for bad parameters."""
    spec = (
        "llm:"
        + provider
        + ("?" + "&".join(f"{k}={v}" for k, v in params.items()) if params else "")
    )
    backend_cls = backend_class(provider)
    params = preset_params(provider, params)
    check_names(backend_cls, params)
    agent_kw: dict[str, Any] = {}
    for key, conv in AGENT_PARAM_TYPES.items():
        if key in params:
            agent_kw[key] = conv(params.pop(key))
    cache = params.pop("cache", None)
    cache_mode = str(params.pop("cache_mode", "readwrite"))
    if cache is None and cache_mode != "readwrite":
        raise TypeError("cache_mode needs cache=PATH (the SQLite file)")
    price_prompt = params.pop("price_prompt", None)
    price_completion = params.pop("price_completion", None)
    backend: Any
    if cache is not None and cache_mode == "read":
        # offline: the model is never contacted; the backend (if it can be built here) only
        # names the model, which is part of the cache key
        try:
            backend = backend_cls(**coerce_params(backend_cls, params))
            model = backend.model
        except Exception:
            backend, model = None, model_name(params)
    else:
        backend = backend_cls(**coerce_params(backend_cls, params))
        model = backend.model
    if cache is not None:
        backend = CachedBackend(backend, str(cache), mode=cache_mode, model=str(model))  # type: ignore[arg-type]
    if price_prompt is not None or price_completion is not None:
        agent_kw["prices"] = {
            str(model): (
                price_value("price_prompt", price_prompt),
                price_value("price_completion", price_completion),
            )
        }
    return spec, backend, agent_kw
