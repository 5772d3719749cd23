"""The decision's grammar in the dialect an OpenAI-compatible server honours.

:func:`agents.llm.decision_grammar.decision_schema` writes one JSON schema per decision; a server
constrains its decoding on a subset of JSON Schema that depends on the server:

- ``"llama.cpp"`` (llama-cpp-python's server, llama-server; ``response_format`` ``json_object``
  with ``schema``): enums, consts, ``anyOf``, ``additionalProperties: false``, ``minItems`` /
  ``maxItems`` and ``pattern`` are honoured; ``minimum``/``maximum`` and ``minProperties`` are
  not (llama-cpp-python's schema-to-grammar converter ignores them). So a bounded integer becomes
  the ``enum`` of its values (exact, up to :data:`ENUM_MAX` values), a bounded number the
  ``enum`` of the whole numbers in its range (decimals are lost: recorded; a range narrower
  than :data:`WHOLE_MIN`, a fraction, is sent as is, its bounds not enforced: recorded), and an object with
  ``minProperties: 1`` an ``anyOf`` of one variant per property, that property required (exact).
- ``"xgrammar"`` (vLLM, SGLang; ``json_schema``): the schema as it is (their grammar backends
  take every keyword the decision grammar uses).
- ``"openai-strict"`` (OpenAI's structured outputs, ``strict: true``): the root must be an
  object, so the decision is wrapped as ``{"action": ...}``; every property is required (an
  optional one may be ``null``); length, item-count, range and pattern keywords are removed
  (recorded). :func:`unwrap_strict` turns the reply back into the action object.

:func:`to_dialect` returns the rewritten schema and one note per keyword the server does not
honour and that was dropped or loosened (``Completion.extra["degraded"]``, the provider rule of
:mod:`agents.llm.providers`). :func:`dialect_for` picks the dialect from the provider preset,
the response format and the URL (provider ``openai`` at a local URL is an unknown local server:
no dialect, the generic legal-action schema goes as before).
"""

from __future__ import annotations

import copy
import json
from typing import Any

#: the dialects :func:`to_dialect` writes
DIALECTS: tuple[str, ...] = ("llama.cpp", "xgrammar", "openai-strict")
#: the most values a bounded integer or number becomes an enum of (llama.cpp)
ENUM_MAX = 512
#: the narrowest number range sent as whole numbers (a narrower one, a fraction, stays a number)
WHOLE_MIN = 20.0
#: the key a strict reply's action sits under (OpenAI's root must be an object)
STRICT_ROOT = "action"
_STRICT_DROPPED = (
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "minProperties",
)


def dialect_for(provider: Any, fmt: str, local: bool) -> str | None:
    """The dialect a server behind ``provider`` (a :class:`~agents.llm.providers.Provider`)
    honours for response format ``fmt``; None: the server takes no decision grammar (the seat
    sends the generic legal-action schema). ``local``: the server's URL is local. ``json_object``
    with a schema is constrained only by llama.cpp's servers, so it means llama.cpp at a local
    URL whatever the preset."""
    dialect = provider.capabilities.schema_dialect
    if fmt == "json_object":
        return "llama.cpp" if dialect == "llama.cpp" or local else None
    if fmt != "json_schema":
        return None
    if provider.name == "openai" and local:
        return None  # an unknown local server under the default preset
    return str(dialect) if dialect is not None else None


def to_dialect(schema: dict[str, Any], dialect: str | None) -> tuple[dict[str, Any], list[str]]:
    """``schema`` rewritten for ``dialect`` (module docstring) and the degradation notes."""
    if dialect is None or dialect == "xgrammar":
        return schema, []
    if dialect not in DIALECTS:
        raise ValueError(f"unknown schema dialect {dialect!r}; known: {', '.join(DIALECTS)}")
    notes: set[str] = set()
    if dialect == "llama.cpp":
        return _llama(copy.deepcopy(schema), notes), sorted(notes)
    root = _strict(copy.deepcopy(schema), notes)
    wrapped = {
        "type": "object",
        "properties": {STRICT_ROOT: root},
        "required": [STRICT_ROOT],
        "additionalProperties": False,
    }
    return wrapped, sorted(notes)


def _walk(node: Any, visit: Any) -> Any:
    if isinstance(node, list):
        return [_walk(n, visit) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _walk(v, visit) for k, v in node.items()}
    return visit(node)


def _values(low: float, high: float, whole: bool) -> list[Any] | None:
    lo, hi = int(-(-low // 1)), int(high // 1)
    if hi - lo + 1 > ENUM_MAX or hi < lo:
        return None
    return [float(v) if not whole else v for v in range(lo, hi + 1)]


def _llama(schema: dict[str, Any], notes: set[str]) -> dict[str, Any]:
    def visit(node: dict[str, Any]) -> dict[str, Any]:
        kind = node.get("type")
        if kind in ("integer", "number") and "enum" not in node and "const" not in node:
            low, high = node.get("minimum"), node.get("maximum")
            lowest = float(low if low is not None else 0)
            if high is not None and kind == "number" and float(high) - lowest < WHOLE_MIN:
                notes.add("number bounds not honoured by llama.cpp: a fraction range sent as is")
                return node
            if high is not None:
                values = _values(lowest, float(high), True)
                if values is None:
                    notes.add("maximum not honoured by llama.cpp: a wide range sent unbounded")
                    return {k: v for k, v in node.items() if k not in ("minimum", "maximum")}
                if kind == "number":
                    notes.add("number bounds not honoured by llama.cpp: sent as whole numbers")
                return {"type": "integer", "enum": values}
        if node.get("minProperties") and isinstance(node.get("properties"), dict):
            rest = {k: v for k, v in node.items() if k != "minProperties"}
            required = list(rest.get("required", []))
            return {
                "anyOf": [
                    {**rest, "required": [*required, name] if name not in required else required}
                    for name in rest["properties"]
                ]
            }
        return node

    result = _walk(schema, visit)
    assert isinstance(result, dict)
    return result


def _strict(schema: dict[str, Any], notes: set[str]) -> dict[str, Any]:
    def visit(node: dict[str, Any]) -> dict[str, Any]:
        for key in _STRICT_DROPPED:
            if key in node:
                node.pop(key)
                notes.add(f"{key} not allowed by OpenAI strict mode: not sent")
        props = node.get("properties")
        if isinstance(props, dict):
            required = set(node.get("required", []))
            node["properties"] = {
                name: prop if name in required else {"anyOf": [prop, {"type": "null"}]}
                for name, prop in props.items()
            }
            node["required"] = list(props)
            node["additionalProperties"] = False
        return node

    result = _walk(schema, visit)
    assert isinstance(result, dict)
    return result


def unwrap_strict(text: str) -> str:
    """A strict reply (``{"action": {...}}`` with ``null`` for the optional fields left out) as
    the action object alone; text that is not such a reply is returned unchanged."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if not isinstance(value, dict) or set(value) != {STRICT_ROOT}:
        return text
    return json.dumps(_drop_nulls(value[STRICT_ROOT]))


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value
