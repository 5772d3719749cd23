"""Which agent specs a server takes from the network: the operator's allow-list.

A line-up that arrives over the network (``POST /matches``, an OpenEnv reset) names agents for
seats the server plays itself. Some specs load code (``py:module:Class``, an installed plug-in,
``torch_policy?path=`` unpickles a file, ``llm:hf`` loads model files), some read the server's
terminal (``human``), some make the server call out (``llm:openai?base_url=``,
``remote?url=``). The rule (docs/security.md):

- a client may name the built-in agents (``agents.registry.REGISTRY``: scripted and rule-based,
  no code, files or network), with their parameters;
- anything else must have been allowed by the operator at start-up: ``--allow-agent NAME``
  allows that agent name with any parameters (``llm:openai``, ``remote``, ``torch_policy``, a
  plug-in's name, ``py:package.module:Class``), ``--allow-agent 'NAME?k=v'`` allows exactly that
  spec and no other parameters;
- every URL in a spec, whatever the agent, must fall under an ``--allow-url PREFIX`` (same
  scheme, host and port, and a path under the prefix's path), unless the whole spec was allowed
  exactly; a URL with a user name or password is refused;
- parameters that name a file or an environment variable of the server (:data:`SERVER_LOCAL_PARAMS`:
  ``path``, ``cache``, ``prompt``, ``token_file``, ...) only in a spec allowed exactly: allowing
  ``torch_policy`` by name does not let a client pick which file it unpickles.

:meth:`SpecPolicy.check` reads the spec's text only: it runs before anything is imported, built
or called, so a refused spec has no effect at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agents.registry import REGISTRY, AgentSpecError, parse_spec

#: parameters that name something of the server's own: a file it reads or writes (a model, a
#: checkpoint, prompt templates, a persona file, a response cache) or an environment variable
SERVER_LOCAL_PARAMS = frozenset(
    {"path", "gguf_file", "adapter", "checkpoint", "prompt", "persona", "cache"}
    | {"token_file", "token_env"}
)
_URL_SCHEMES = ("http://", "https://", "ws://", "wss://")


class SpecRefused(AgentSpecError):
    """A spec from the network that this server's operator has not allowed."""


@dataclass(frozen=True)
class _Url:
    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, text: str) -> _Url:
        """ValueError unless ``text`` is an http(s)/ws(s) URL without user name or password."""
        parts = urlsplit(text.strip())
        if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            raise ValueError(f"{text!r} is not an http(s) URL")
        if parts.username is not None or parts.password is not None or "@" in parts.netloc:
            raise ValueError(f"{text!r} holds a user name or password")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"{text!r} has an invalid port") from None
        default = 443 if parts.scheme in ("https", "wss") else 80
        return cls(parts.scheme, parts.hostname.lower(), port or default, parts.path or "/")

    def under(self, prefix: _Url) -> bool:
        """Same scheme, host and port, and a path at or under the prefix's (by whole segments)."""
        if (self.scheme, self.host, self.port) != (prefix.scheme, prefix.host, prefix.port):
            return False
        base = prefix.path.rstrip("/")
        return self.path == base or self.path.startswith(base + "/") or base == ""


def _urls(params: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """(key, value) of every parameter that is a URL (by its value, whatever its key)."""
    for key, value in params.items():
        if isinstance(value, str) and value.strip().lower().startswith(_URL_SCHEMES):
            yield key, value
        elif key in ("url", "base_url") and value is not None:
            yield key, str(value)


@dataclass(frozen=True)
class SpecPolicy:
    """The operator's allow-list (see the module docstring). The default allows the built-ins
    only."""

    agents: frozenset[str] = frozenset()
    urls: tuple[str, ...] = ()

    @classmethod
    def from_lists(cls, agents: Iterable[str] = (), urls: Iterable[str] = ()) -> SpecPolicy:
        """A policy from ``--allow-agent`` and ``--allow-url`` values; ValueError names a bad
        one."""
        names = frozenset(a.strip() for a in agents if a.strip())
        for name in names:
            parse_spec(name)  # AgentSpecError (a ValueError) for a malformed spec
        prefixes = tuple(u.strip() for u in urls if u.strip())
        for url in prefixes:
            try:
                _Url.parse(url)
            except ValueError as exc:
                raise ValueError(f"--allow-url {url!r}: {exc}") from None
        return cls(names, prefixes)

    def check(self, spec: str, role: str | None = None) -> None:
        """Raise :class:`SpecRefused` (one line, with the flag that would allow it) unless this
        server may build ``spec`` for a seat named by a client. Reads the text only.

        A talk-off twin (``talk_off:SPEC``, :mod:`agents.talk_off`) is checked as ``SPEC``: it
        loads, reads and calls exactly what ``SPEC`` does (an exact allow of the whole
        ``talk_off:`` spec also allows it)."""
        text = spec.strip() if isinstance(spec, str) else spec
        if isinstance(text, str) and text.startswith("talk_off:") and text not in self.agents:
            return self.check(text[len("talk_off:") :], role)
        name, params = parse_spec(spec)
        exact = spec.strip() in self.agents
        if not exact and name not in REGISTRY and name not in self.agents:
            builtin = ", ".join(sorted(REGISTRY)[:6])
            raise SpecRefused(
                f"agent spec {spec!r}: {self._why(name)} is not allowed from the network on this "
                f"server; clients may name built-in agents ({builtin}, ...; see "
                f"'gpumarket agents'); its operator can allow it with --allow-agent {name}"
            )
        if exact:
            return
        for key in sorted(SERVER_LOCAL_PARAMS & set(params)):
            raise SpecRefused(
                f"agent spec {spec!r}: parameter {key!r} names a file or variable of the server; "
                "only a spec its operator allowed exactly (--allow-agent 'SPEC') may use it"
            )
        for key, value in _urls(params):
            try:
                url = _Url.parse(value)
            except ValueError as exc:
                raise SpecRefused(f"agent spec {spec!r}: {key}: {exc}") from None
            if not any(url.under(_Url.parse(prefix)) for prefix in self.urls):
                raise SpecRefused(
                    f"agent spec {spec!r}: {key}={value!r} is not under a URL this server may "
                    "call; its operator can allow it with --allow-url "
                    f"{url.scheme}://{url.host}:{url.port}"
                )

    @staticmethod
    def _why(name: str) -> str:
        if name.startswith("py:"):
            return f"{name!r} (it imports code)"
        if name.startswith("llm:"):
            return f"the LLM seat {name!r}"
        return f"agent {name!r}"

    def describe(self) -> str:
        """One line for the server's start-up message."""
        extra = ", ".join(sorted(self.agents)) or "none"
        urls = ", ".join(self.urls) or "none"
        return f"built-in agents, plus agents: {extra}; URLs: {urls}"


__all__ = ["SERVER_LOCAL_PARAMS", "SpecPolicy", "SpecRefused"]
