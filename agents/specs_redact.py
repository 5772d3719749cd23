"""Secrets taken out of agent specs, URLs and messages before they are shown or written.

A spec such as ``remote?url=http://HOST:9000&token=SECRET`` is the key to an agent service, so
wherever the run shows or records a seat's spec (transcript headers, ``results.jsonl``, run
manifests, reports, terminal tables, spectator views, logs) it goes through :func:`redact_spec`
first: ``remote?url=http://HOST:9000&token=***``.

The rules:

- a query parameter whose name says it holds a secret (``token``, ``key``, ``api_key``,
  ``password``, ``secret``, ``auth``, and names ending ``_token``, ``_key``, ``_secret``,
  ``_password``) keeps its name and shows ``***`` as its value; a name ending ``_env``, ``_file``
  or ``_path`` (``token_env=VAR``, ``token_file=PATH``) says *where* a secret is, not the secret,
  and is kept;
- a URL's user-info (``http://user:pass@host``) becomes ``***@host``, and a URL's own query is
  redacted by the same rule (a parameter value that is a URL is redacted inside);
- anything without a secret is returned unchanged, byte for byte (recorded specs of honest runs,
  and the golden transcripts, stay as they were);
- one built-in parameter is public though its name is not: the ``colluder``'s ``token``, the
  handshake word its cartel posts in public messages (:data:`PUBLIC_PARAMS`).

A redacted spec is for people to read: it does not rebuild the agent it names (the secret is
gone), so a transcript header marks such a seat not ``rebuildable``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit, urlunsplit

#: what a secret value is shown as
MASK = "***"

_SECRET_NAMES = frozenset(
    {
        "token",
        "key",
        "apikey",
        "api_key",
        "password",
        "passwd",
        "pwd",
        "pass",
        "secret",
        "auth",
        "authorization",
        "bearer",
        "credential",
        "credentials",
        "cookie",
        "session",
        "signature",
        "sig",
    }
)
#: (agent name, parameter) pairs shown as they are although the name reads like a secret
PUBLIC_PARAMS = frozenset({("colluder", "token")})
_SECRET_SUFFIXES = ("_token", "_key", "_apikey", "_secret", "_password", "_passwd", "_pwd")
_WHERE_SUFFIXES = ("_env", "_file", "_path")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_PAIR = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z][A-Za-z0-9_.-]*)=([^&\s'\"<>`,;)]+)")


def is_secret_name(name: str) -> bool:
    """Whether a query parameter called ``name`` holds a secret (see the module docstring)."""
    n = name.strip().lower().replace("-", "_")
    if n.endswith(_WHERE_SUFFIXES):
        return False
    return n in _SECRET_NAMES or n.endswith(_SECRET_SUFFIXES)


def _redact_query(query: str, agent: str = "") -> str:
    """A raw ``k=v&k=v`` query with every secret value masked; unchanged text where none is."""
    out = []
    for part in query.split("&"):
        raw_key, eq, raw_value = part.partition("=")
        key = unquote_plus(raw_key)
        if eq and raw_value and is_secret_name(key) and (agent, key) not in PUBLIC_PARAMS:
            part = f"{raw_key}={MASK}"
        elif eq and "://" in unquote_plus(raw_value):
            value = unquote_plus(raw_value)
            shown = redact_url(value)
            if shown != value:
                part = f"{raw_key}={quote(shown, safe=':/@*[]')}"
        out.append(part)
    return "&".join(out)


def redact_url(url: str) -> str:
    """``url`` without secrets: user-info masked, secret query parameters masked."""
    if not isinstance(url, str) or "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. a malformed IPv6 host: mask everything after the scheme
        return url.split("://", 1)[0] + "://" + MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[1]}"
    query = _redact_query(parts.query) if parts.query else parts.query
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_spec(spec: str) -> str:
    """An agent spec as it may be shown or recorded: its secrets masked (module docstring).
    Anything that is not a string is returned as it is."""
    if not isinstance(spec, str):
        return spec
    name, sep, query = spec.partition("?")
    if not sep:
        return redact_url(spec) if "://" in spec else spec
    shown = _redact_query(query, name.strip())
    return spec if shown == query else f"{name}?{shown}"


def redact_text(text: Any) -> Any:
    """Free text (an error message, a log line) with the secrets of any URL or ``name=value``
    pair in it masked; anything that is not a string is returned as it is."""
    if not isinstance(text, str) or ("=" not in text and "://" not in text):
        return text
    text = _URL.sub(lambda m: redact_url(m.group()), text)

    def pair(m: re.Match[str]) -> str:
        if is_secret_name(m.group(1)) and m.group(2) != MASK:
            return f"{m.group(1)}={MASK}"
        return m.group()

    return _PAIR.sub(pair, text)


__all__ = ["MASK", "PUBLIC_PARAMS", "is_secret_name", "redact_spec", "redact_text", "redact_url"]
