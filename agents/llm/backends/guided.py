"""Guided decoding for local backends: how a reply that must match a JSON schema starts
(:func:`schema_guide`: the opening ``{`` and, for a discriminated union such as the legal actions,
the discriminator key and its allowed constants) and where its top-level object ends
(:func:`json_object_end`). Pure string and schema work, no model."""

from __future__ import annotations

import json
from typing import Any


def _variants(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives of a schema: nested oneOf/anyOf flattened, local ``$ref``s resolved."""
    defs = schema.get("$defs") or schema.get("definitions") or {}
    out: list[dict[str, Any]] = []

    def walk(node: Any, depth: int) -> None:
        if not isinstance(node, dict) or depth > 8:
            out.append({})
            return
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            walk(defs.get(ref.rsplit("/", 1)[-1]), depth + 1)
            return
        alternatives = node.get("oneOf") or node.get("anyOf")
        if isinstance(alternatives, list) and alternatives:
            for alt in alternatives:
                walk(alt, depth + 1)
            return
        out.append(node)

    walk(schema, 0)
    return out


def _string_values(prop: Any) -> list[str] | None:
    if not isinstance(prop, dict):
        return None
    if isinstance(prop.get("const"), str):
        return [prop["const"]]
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return list(enum)
    return None


def schema_guide(schema: dict[str, Any] | None) -> tuple[str, list[str] | None]:
    """How to start a reply that must match ``schema``: ``(prefix, values)``.

    The prefix opens an object (``{``). When alternatives of the schema require a key whose value
    is a string constant (a discriminator such as ``action_type``; the schema's declared
    discriminator first, else the key most alternatives share), the prefix also opens that key's
    string and ``values`` lists the constants; the reply is then valid only under those
    alternatives, which is a subset of what the schema admits. Otherwise, when every alternative
    requires one same key, the prefix holds that key. ``("", None)`` without a schema.
    """
    if not isinstance(schema, dict):
        return "", None
    nodes = _variants(schema)
    counts: dict[str, int] = {}
    constants: dict[str, list[str]] = {}
    for node in nodes:
        properties = node.get("properties") or {}
        for key in node.get("required") or []:
            found = _string_values(properties.get(key))
            if found is not None:
                counts[key] = counts.get(key, 0) + 1
                known = constants.setdefault(key, [])
                known += [v for v in found if v not in known]
    declared = (schema.get("discriminator") or {}).get("propertyName")
    if counts:
        key = declared if declared in counts else max(counts, key=lambda k: counts[k])
        return "{" + json.dumps(key) + ': "', constants[key]
    required = [node.get("required") for node in nodes]
    if nodes and all(isinstance(r, list) and r for r in required):
        common = set(required[0]).intersection(*map(set, required[1:]))
        first = next((k for k in required[0] if k in common), None)
        key = declared if declared in common else first
        if key is not None:
            return "{" + json.dumps(str(key)) + ": ", None
    return "{", None


def json_object_end(text: str) -> int | None:
    """The index just past the first complete top-level JSON object in ``text`` (None: not yet)."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = depth > 0
        elif ch in "{[":
            depth += 1
        elif ch in "}]" and depth > 0:
            depth -= 1
            if depth == 0:
                return i + 1
    return None
