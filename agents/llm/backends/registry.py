"""Chat backends by name: a provider resolves to its backend class, imported on first use.

The rule: a module that may build a backend (an LLM seat, the LLM judge, the LLM conduct reader)
names it here by provider and never imports a backend module itself. :data:`PROVIDERS` maps a
provider name to ``"module:Class"`` and :func:`backend_class` imports that module only when a spec
asks for it. So building an environment with the rule judge, or starting the ``gpumarket``
command, never imports an HTTP client (the ``openai`` package and its ``aiohttp``/``httpx``
transports cost more start-up time than the rest of the market: issue 15).

Providers: ``openai`` and every preset or alias of :mod:`agents.llm.providers` (``vllm``,
``llama.cpp``, ``ollama``, ``groq``...) are the OpenAI-compatible backend; ``hf`` is the
in-process transformers backend; any other name of the form ``module:Class`` is imported as given.
"""

from __future__ import annotations

import importlib

from agents.llm.providers import ALIASES, PRESETS

__all__ = ["OPENAI_BACKEND", "PROVIDERS", "backend_class"]

#: the OpenAI-compatible chat backend (OpenAI, vLLM, llama.cpp, Ollama, ...)
OPENAI_BACKEND = "agents.llm.backends.openai_backend:OpenAIBackend"
#: provider name -> ``"module:Class"`` of the backend that serves it
PROVIDERS: dict[str, str] = {
    "openai": OPENAI_BACKEND,
    "hf": "agents.llm.backends.hf_backend:HFBackend",
    **{name: OPENAI_BACKEND for name in (*PRESETS, *ALIASES) if name != "openai"},
}
# the other usual spellings of a transformers backend class, tolerated in ``module:Class``
OTHER_CLASS_NAMES = ("HFBackend", "HfBackend", "TransformersBackend")


def backend_class(provider: str) -> type:
    """The backend class of a provider name (``openai``, ``hf``, a preset) or ``module:Class``;
    its module is imported now, on first use. An unknown name raises ``TypeError`` listing the
    known ones."""
    target = PROVIDERS.get(provider, provider)
    module_name, _, class_name = target.partition(":")
    if not class_name:
        raise TypeError(
            f"unknown LLM provider {provider!r}; known: {', '.join(PROVIDERS)} (or module:Class)"
        )
    module = importlib.import_module(module_name)
    cls: type | None = getattr(module, class_name, None)
    if cls is None:
        cls = next((getattr(module, n) for n in OTHER_CLASS_NAMES if hasattr(module, n)), None)
    if cls is None:
        raise TypeError(f"{module_name} has no backend class {class_name}")
    return cls
