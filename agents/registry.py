"""Agent specs: ``name`` or ``name?key=value&...``, resolved to an agent instance.

Where an agent comes from: the built-ins below; installed plug-ins (entry-point group
``gpumarket.agents``: ``name = "package.module:ClassName"``); ``py:package.module:ClassName`` for
any importable class; ``llm:openai?...`` and ``llm:hf?...`` for LLM seats (agents/llm/agent.py); ``remote?url=...`` for
an agent service over HTTP (agents/remote.py).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, cast
from urllib.parse import parse_qsl

from agents.base import BaseAgent, unknown_parameter_message
from agents.human import HumanAgent
from agents.population import (
    ARCHETYPES,
    ColluderBidder,
    DaedalusRobustDesigner,
    DropoutBidder,
    ExploiterBidder,
    GreedyHoarder,
    LiarBidder,
    NoNegotiationBidder,
    PromiseBreaker,
    ReciprocalBidder,
    RuleDesigner,
    RuleExpert,
    ShaderBidder,
    ShortSeller,
)
from agents.remote import RemoteAgent
from agents.scripted import (
    AlwaysAcceptBidder,
    CoalitionSpammer,
    FixedDesigner,
    IdleBidder,
    OfferSpammer,
    PitchSpammer,
    RandomDesigner,
    RandomValidBidder,
    TruthfulBidder,
)
from agents.talk_off import TalkOffAgent, inner_spec
from agents.torch_policy import TorchPolicyAgent

_BUILT_INS: tuple[type[BaseAgent], ...] = (
    TruthfulBidder,
    IdleBidder,
    RandomValidBidder,
    AlwaysAcceptBidder,
    FixedDesigner,
    RandomDesigner,
    OfferSpammer,
    CoalitionSpammer,
    PitchSpammer,
    ShaderBidder,
    ColluderBidder,
    DropoutBidder,
    ExploiterBidder,
    GreedyHoarder,
    NoNegotiationBidder,
    RuleExpert,
    RuleDesigner,
    DaedalusRobustDesigner,
    *ARCHETYPES,
    ShortSeller,
    LiarBidder,
    PromiseBreaker,
    ReciprocalBidder,
)
REGISTRY: dict[str, Callable[..., BaseAgent]] = {cls.name: cls for cls in _BUILT_INS}
# agents that cannot play without a parameter (a checkpoint file): resolvable by name, but not
# in REGISTRY, whose agents all play with no parameters (sweeps and tournaments rely on that)
WITH_PARAMS: dict[str, Callable[..., BaseAgent]] = {
    TorchPolicyAgent.name: TorchPolicyAgent,
    RemoteAgent.name: RemoteAgent,
    HumanAgent.name: HumanAgent,  # a person at a terminal (gpumarket play)
}


class AgentSpecError(ValueError):
    """An agent spec could not be resolved; the message lists what is available."""


ENTRY_POINT_GROUP = "gpumarket.agents"
SPEC_HELP = (
    "a spec is NAME or NAME?key=value&key=value (NAME: a registered agent or a plug-in from the "
    "'gpumarket.agents' entry-point group), py:package.module:ClassName?..., "
    "llm:openai?model=...&base_url=..., llm:hf?path=..., torch_policy?path=CHECKPOINT, or "
    "remote?url=http://HOST:PORT&token_env=VAR (an agent service)"
)

#: the specs ``gpumarket agents`` lists after the named agents (they take parameters)
OTHER_SPECS = (
    "py:package.module:ClassName?..., llm:openai?model=...&base_url=..., llm:hf?path=..., "
    "torch_policy?path=CHECKPOINT (a policy from gpumarket train), "
    "remote?url=http://HOST:PORT&token_env=VAR (an agent service)"
)


def _coerce(value: str) -> Any:
    """Query-string values to Python: true/false, integers and floats; anything else stays text."""
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name?k=v&k2=v2"`` -> ``("name", {"k": v, "k2": v2})`` with values coerced."""
    if not isinstance(spec, str) or not spec.strip():
        raise AgentSpecError(f"empty agent spec; {SPEC_HELP}")
    name, _, query = spec.strip().partition("?")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise AgentSpecError(
            f"agent spec {spec!r}: the part after '?' must be key=value pairs joined by '&'"
        ) from None
    return name.strip(), {k: _coerce(v) for k, v in pairs}


def plugins() -> dict[str, Any]:
    """Agents registered by installed distributions under the ``gpumarket.agents`` group."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


#: what ``gpumarket agents`` shows for an agent whose class has no docstring of its own
NO_DESCRIPTION = "(no description: give the class a docstring; its first paragraph is shown here)"
# reST in docstrings: :role:`target`, :role:`Title <target>`, ``code``, `text`, `link <url>`_,
# **strong**, *emphasis*, \-escapes and a paragraph's closing "::"
_ROLE = re.compile(r":[A-Za-z][\w.+-]*(?::[\w.+-]+)*:`([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>`]+>`__?")
_LITERAL = re.compile(r"``(.+?)``")
_INTERPRETED = re.compile(r"`([^`]+)`_{0,2}")
_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")


def _role_text(match: re.Match[str]) -> str:
    text = match.group(1).strip()
    if text.endswith(">") and "<" in text:  # :role:`Title <target>` shows the title
        return text[: text.index("<")].strip()
    text = text.lstrip("!")
    if text.startswith("~"):  # :func:`~pkg.mod.name` shows the last component
        return text[1:].rsplit(".", 1)[-1]
    return text.lstrip(".")


def plain_text(text: str) -> str:
    """reST inline markup stripped to the words a reader sees, on one line."""
    text = _ROLE.sub(_role_text, text)
    text = _LINK.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    text = re.sub(r"\\(.)", r"\1", text)
    text = " ".join(text.split())
    return text[:-1] if text.endswith("::") else text


def description(factory: object) -> str:
    """What ``gpumarket agents`` says of an agent: the first paragraph of its class's own
    docstring (not one inherited from a base class) as plain text on one line, or
    :data:`NO_DESCRIPTION`."""
    own = vars(factory).get("__doc__") if isinstance(factory, type) else factory.__doc__
    if not isinstance(own, str) or not own.strip():
        return NO_DESCRIPTION
    return plain_text(inspect.cleandoc(own).split("\n\n")[0]) or NO_DESCRIPTION


@dataclass(frozen=True)
class PluginStatus:
    """One installed plug-in, loaded: its entry point, the seats it fills and its description
    (:func:`description`), or ``error`` (why it is broken: the import failed, or it is not an
    agent)."""

    name: str
    target: str  # the entry point's ``package.module:ClassName``
    roles: tuple[str, ...] = ()
    doc: str = ""
    error: str | None = None


def plugin_status() -> list[PluginStatus]:
    """Every plug-in of the ``gpumarket.agents`` group, each imported to see whether it works; a
    plug-in whose import raises is reported broken, with the error, instead of raising."""
    out = []
    for name, ep in sorted(plugins().items()):
        try:
            factory = ep.load()
        except Exception as exc:  # a broken plug-in must not take the listing down
            out.append(
                PluginStatus(name, ep.value, error=f"import failed: {type(exc).__name__}: {exc}")
            )
            continue
        roles = getattr(factory, "roles", None)
        if not roles:
            out.append(PluginStatus(name, ep.value, error="loads, but is not an agent (no roles)"))
            continue
        out.append(PluginStatus(name, ep.value, tuple(sorted(roles)), description(factory)))
    return out


def _load_py(target: str) -> Callable[..., BaseAgent]:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise AgentSpecError(f"py:{target}: write py:package.module:ClassName")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentSpecError(
            f"py:{target}: cannot import {module_name!r} ({exc}); is it installed or on PYTHONPATH?"
        ) from None
    factory: Callable[..., BaseAgent] | None = getattr(module, attr, None)
    if factory is None:
        raise AgentSpecError(f"py:{target}: module {module_name!r} has no attribute {attr!r}")
    return factory


def _resolve(name: str) -> Callable[..., BaseAgent]:
    if name.startswith("py:"):
        return _load_py(name[3:])
    if name in REGISTRY:
        return REGISTRY[name]
    if name in WITH_PARAMS:
        return WITH_PARAMS[name]
    found = plugins().get(name)
    if found is not None:
        try:
            return cast("Callable[..., BaseAgent]", found.load())
        except Exception as exc:  # a broken plug-in must not take the registry down
            raise AgentSpecError(
                f"plug-in agent {name!r} ({found.value}) failed to load: {exc}"
            ) from None
    known = sorted({*REGISTRY, *plugins()})
    raise AgentSpecError(f"unknown agent {name!r}; available: {', '.join(known)}; {SPEC_HELP}")


def _make_llm(kind: str, params: dict[str, Any]) -> BaseAgent:
    # the LLM seat (its prompts, templates and backends) is loaded when a spec names one: a run
    # of scripted seats never pays for it (start-up time of the CLI, issue 15)
    from agents.llm.agent import make_llm_agent

    try:
        return make_llm_agent(kind, params)
    except (TypeError, ValueError) as exc:
        raise AgentSpecError(f"llm:{kind}: {exc}") from None


def _check_params(name: str, factory: Callable[..., BaseAgent], params: dict[str, Any]) -> None:
    """Refuse a parameter the agent does not take, naming the ones it does (and the nearest)."""
    if not params:  # nothing to refuse (a run builds its seats' agents every episode)
        return
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to check against: the call will say
        return
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    valid = [
        n
        for n, p in sig.parameters.items()
        if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    for key in params:
        if key not in valid:
            raise AgentSpecError(unknown_parameter_message(key, f"agent {name!r}", {name: valid}))


def make_agent(spec: str, role: str | None = None) -> BaseAgent:
    """Build a fresh agent from its spec; ``role`` ('designer' or 'bidder') is checked if given."""
    twin_of = inner_spec(spec)
    if twin_of is not None:  # the talk-off twin (agents/talk_off.py)
        if not twin_of:
            raise AgentSpecError(
                f"agent spec {spec!r}: write talk_off:SPEC, e.g. talk_off:rule_expert?hedge=false"
            )
        return TalkOffAgent(make_agent(twin_of, role), twin_of)
    name, params = parse_spec(spec)
    if name.startswith("llm:"):
        agent = _make_llm(name[4:], params)
    else:
        factory = _resolve(name)
        _check_params(name, factory, params)
        try:
            agent = factory(**params)
        except TypeError as exc:
            raise AgentSpecError(
                f"agent {name!r} does not take parameters {sorted(params)}: {exc}"
            ) from None
        except ValueError as exc:
            raise AgentSpecError(f"agent {name!r}: {exc}") from None
    roles = getattr(agent, "roles", None)
    if not roles or not callable(getattr(agent, "act", None)):
        raise AgentSpecError(
            f"{name!r} did not build an agent (it needs act(observation) and roles)"
        )
    if role is not None and role not in roles:
        raise AgentSpecError(
            f"agent {name!r} cannot fill a {role} seat (it fills: {', '.join(sorted(roles))})"
        )
    return agent


def registered(role: str | None = None) -> list[str]:
    """Built-in and plug-in agent names (plug-ins are listed without loading them)."""
    names = {
        n for n, f in REGISTRY.items() if role is None or role in getattr(f, "roles", frozenset())
    }
    return sorted(names | set(plugins()))
