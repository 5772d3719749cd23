"""Provider presets: the OpenAI-compatible servers an LLM seat can name, and what each supports.

``llm:PROVIDER?model=...`` picks a preset by name (``llm:vllm?model=Qwen/Qwen2.5-7B-Instruct``);
``llm:openai?provider=vllm&...`` says the same. A preset gives the default base URL, the
environment variable that holds the API key, and a :class:`Capabilities` record: which response
formats, tool-choice forms and request fields the server accepts, as its documentation states
(local servers: as measured where a test says so). Every field can still be overridden in the
spec (``base_url=``, ``api_key_env=``, ``response_format=``).

The rule for a feature the provider lacks: the backend does not send it, or sends the nearest
supported form, and says so in ``Completion.extra["degraded"]`` (one short sentence per feature,
e.g. ``"seed not supported by groq: not sent"``), which the agent counts. Never silently.
:func:`adapt_request` applies that rule to one request body.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the tool_choice forms a server may accept ("forced": ``{"type": "function", ...}``)
TOOL_CHOICES: tuple[str, ...] = ("auto", "required", "forced", "none")


@dataclass(frozen=True)
class Capabilities:
    """What one provider accepts in a chat.completions request.

    ``response_formats``: the structured-output forms it honours, preferred first (empty: none;
    the schema is then not sent). ``tool_choice``: the accepted forms of :data:`TOOL_CHOICES`.
    ``reasoning_effort``: it takes the ``reasoning_effort`` field; ``reasoning_output``: it may
    return reasoning (a ``reasoning_content``/``reasoning`` field or ``<think>`` blocks).
    ``tokenize``: how to count tokens on the server (``"llama-cpp-python"``: ``POST
    /extras/tokenize/count``, falling back to llama-server's ``POST /tokenize``; ``"vllm"``:
    ``POST /tokenize``; None: not offered).
    """

    response_formats: tuple[str, ...] = ("json_schema", "json_object")
    tools: bool = True
    tool_choice: frozenset[str] = frozenset(TOOL_CHOICES)
    parallel_tool_calls: bool = True
    seed: bool = True
    reasoning_effort: bool = False
    reasoning_output: bool = False
    logprobs: bool = True
    tokenize: str | None = None
    schema_dialect: str | None = None


@dataclass(frozen=True)
class Provider:
    """A named preset: default ``base_url``, API key variable, capabilities and a short note."""

    name: str
    base_url: str
    api_key_env: str
    capabilities: Capabilities = field(default_factory=Capabilities)
    note: str = ""

    @property
    def response_format(self) -> str:
        """The structured-output form used unless the spec names one."""
        return (
            self.capabilities.response_formats[0] if self.capabilities.response_formats else "none"
        )


_ALL = frozenset(TOOL_CHOICES)
PRESETS: dict[str, Provider] = {
    p.name: p
    for p in (
        Provider(
            "openai",
            "https://api.openai.com/v1",
            "OPENAI_API_KEY",
            Capabilities(reasoning_effort=True, schema_dialect="openai-strict"),
            "reasoning_effort for reasoning models; reasoning text is not returned",
        ),
        Provider(
            "vllm",
            "http://127.0.0.1:8000/v1",
            "VLLM_API_KEY",
            Capabilities(
                reasoning_effort=True,
                reasoning_output=True,
                tokenize="vllm",
                schema_dialect="xgrammar",
            ),
            "tools need --enable-auto-tool-choice and a --tool-call-parser; reasoning_content "
            "needs --reasoning-parser",
        ),
        Provider(
            "llama.cpp",
            "http://127.0.0.1:8080/v1",
            "LLAMA_API_KEY",
            Capabilities(
                response_formats=("json_object",),
                tool_choice=frozenset({"auto", "forced", "none"}),
                parallel_tool_calls=False,
                reasoning_output=True,
                tokenize="llama-cpp-python",
                schema_dialect="llama.cpp",
            ),
            "json_schema gives HTTP 500 (json_object is constrained); tools need "
            "--chat_format chatml-function-calling (llama-cpp-python) or --jinja (llama-server); "
            "tool_choice=required gives HTTP 500 (measured), so it is sent as auto",
        ),
        Provider(
            "ollama",
            "http://127.0.0.1:11434/v1",
            "OLLAMA_API_KEY",
            Capabilities(
                tool_choice=frozenset({"auto"}),
                parallel_tool_calls=False,
                reasoning_effort=True,
                reasoning_output=True,
                logprobs=False,
            ),
            "tool_choice other than auto is not honoured",
        ),
        Provider(
            "sglang",
            "http://127.0.0.1:30000/v1",
            "SGLANG_API_KEY",
            Capabilities(reasoning_effort=True, reasoning_output=True, schema_dialect="xgrammar"),
            "tools need --tool-call-parser; reasoning_content needs --reasoning-parser",
        ),
        Provider(
            "lmstudio",
            "http://127.0.0.1:1234/v1",
            "LMSTUDIO_API_KEY",
            Capabilities(
                response_formats=("json_schema",),
                tool_choice=frozenset({"auto", "required", "none"}),
                parallel_tool_calls=False,
                reasoning_output=True,
                logprobs=False,
            ),
        ),
        Provider(
            "openrouter",
            "https://openrouter.ai/api/v1",
            "OPENROUTER_API_KEY",
            Capabilities(reasoning_effort=True, reasoning_output=True),
            "what is honoured depends on the routed model",
        ),
        Provider(
            "together",
            "https://api.together.xyz/v1",
            "TOGETHER_API_KEY",
            Capabilities(reasoning_effort=True, reasoning_output=True),
        ),
        Provider(
            "groq",
            "https://api.groq.com/openai/v1",
            "GROQ_API_KEY",
            Capabilities(reasoning_effort=True, reasoning_output=True, logprobs=False),
            "logprobs, logit_bias and top_logprobs give HTTP 400",
        ),
        Provider(
            "deepseek",
            "https://api.deepseek.com/v1",
            "DEEPSEEK_API_KEY",
            Capabilities(
                response_formats=("json_object",),
                parallel_tool_calls=False,
                seed=False,
                reasoning_output=True,
            ),
            "deepseek-reasoner returns reasoning_content and takes no tools",
        ),
        Provider(
            "gemini",
            "https://generativelanguage.googleapis.com/v1beta/openai",
            "GEMINI_API_KEY",
            Capabilities(parallel_tool_calls=False, reasoning_effort=True, logprobs=False),
            "Google's OpenAI-compatible endpoint",
        ),
        Provider(
            "anthropic",
            "https://api.anthropic.com/v1",
            "ANTHROPIC_API_KEY",
            Capabilities(response_formats=(), seed=False, reasoning_effort=False, logprobs=False),
            "Anthropic's OpenAI-compatible endpoint ignores response_format, seed, "
            "reasoning_effort and logprobs",
        ),
    )
}
#: other spellings of a preset name
ALIASES: dict[str, str] = {
    "llamacpp": "llama.cpp",
    "llama_cpp": "llama.cpp",
    "lm-studio": "lmstudio",
}


def preset(name: str) -> Provider:
    """The preset called ``name`` (or one of its :data:`ALIASES`); ValueError naming the known ones."""
    found = PRESETS.get(ALIASES.get(name, name))
    if found is None:
        raise ValueError(
            f"unknown provider {name!r}; known: {', '.join(PRESETS)} (aliases: "
            f"{', '.join(ALIASES)})"
        )
    return found


def tool_choice_form(choice: Any) -> str:
    """``auto``/``required``/``none`` as given; a dict naming a function is ``forced``."""
    return "forced" if isinstance(choice, dict) else str(choice)


def adapt_request(body: dict[str, Any], provider: Provider) -> list[str]:
    """Make ``body`` fit ``provider`` in place; return one note per feature dropped or changed.

    Rules: ``seed``, ``reasoning_effort`` and ``logprobs``/``top_logprobs`` are removed where not
    supported; ``tools`` (with ``tool_choice`` and ``parallel_tool_calls``) are removed where tools
    are not supported; an unsupported ``tool_choice`` becomes the nearest supported form (forced
    -> required -> auto, required -> forced when there is one tool -> auto), or is removed;
    ``parallel_tool_calls`` is removed silently where not supported when it is False (one call
    per reply is what the server does anyway with one forced function).
    """
    caps, name, notes = provider.capabilities, provider.name, []
    if "seed" in body and not caps.seed:
        del body["seed"]
        notes.append(f"seed not supported by {name}: not sent")
    if "reasoning_effort" in body and not caps.reasoning_effort:
        del body["reasoning_effort"]
        notes.append(f"reasoning_effort not supported by {name}: not sent")
    for key in ("logprobs", "top_logprobs"):
        if key in body and not caps.logprobs:
            del body[key]
            notes.append(f"{key} not supported by {name}: not sent")
    if "tools" in body and not caps.tools:
        for key in ("tools", "tool_choice", "parallel_tool_calls"):
            body.pop(key, None)
        notes.append(f"tools not supported by {name}: not sent")
    if "tool_choice" in body:
        form = tool_choice_form(body["tool_choice"])
        if form not in caps.tool_choice:
            tools = body.get("tools") or []
            substitute = _nearest_choice(form, caps.tool_choice, tools)
            if substitute is None:
                del body["tool_choice"]
                notes.append(f"tool_choice={form} not supported by {name}: not sent")
            else:
                body["tool_choice"] = substitute
                notes.append(
                    f"tool_choice={form} not supported by {name}: "
                    f"sent {tool_choice_form(substitute)}"
                )
    if "parallel_tool_calls" in body and not caps.parallel_tool_calls:
        value = body.pop("parallel_tool_calls")
        if value:
            notes.append(f"parallel_tool_calls not supported by {name}: not sent")
    return notes


def _nearest_choice(form: str, accepted: frozenset[str], tools: list[Any]) -> Any:
    if form == "forced" and "required" in accepted:
        return "required"
    if form == "required" and "forced" in accepted and len(tools) == 1:
        return {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
    if form in ("forced", "required") and "auto" in accepted:
        return "auto"
    return None


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def presets_table() -> str:
    """The presets as a Markdown table (docs/llm-seats.md carries it; a test keeps them equal)."""
    rows = [
        "| provider | default base_url | key variable | response_format | tools | tool_choice "
        "| seed | reasoning_effort | reasoning returned | logprobs | token count |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in PRESETS.values():
        c = p.capabilities
        choices = ", ".join(ch for ch in TOOL_CHOICES if ch in c.tool_choice) if c.tools else "-"
        rows.append(
            f"| `{p.name}` | `{p.base_url}` | `{p.api_key_env}` | "
            f"{', '.join(c.response_formats) or 'not sent'} | {_yes(c.tools)} | {choices} | "
            f"{_yes(c.seed)} | {_yes(c.reasoning_effort)} | {_yes(c.reasoning_output)} | "
            f"{_yes(c.logprobs)} | {c.tokenize or '-'} |"
        )
    return "\n".join(rows)
