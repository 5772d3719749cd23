"""The safe HTML kit of the report: :class:`Safe` markup, :func:`esc` and :func:`h` (which
escape every piece of transcript text on its way into the page), number and text formatting, and
the generic blocks (tables, preformatted text, key-value lists)."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# --- safe HTML building ------------------------------------------------------------------


class Safe(str):
    """Markup that is already escaped (built by :func:`h` or :func:`esc`)."""

    __slots__ = ()


def clean_text(value: Any) -> str:
    """``str(value)`` with lone surrogates replaced, so the page always encodes as UTF-8."""
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", "replace").decode("utf-8") if _has_surrogate(text) else text


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def esc(value: Any) -> Safe:
    """HTML-escape anything (quotes included) unless it is already :class:`Safe`."""
    if isinstance(value, Safe):
        return value
    return Safe(html.escape(clean_text(value), quote=True))


_VOID = frozenset({"meta", "br", "hr", "col", "wbr"})
_ATTR_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9_:-]*$")


def _attr_name(key: str) -> str:
    name = key.rstrip("_").replace("_", "-")
    if not _ATTR_NAME.match(name) or name.lower().startswith("on"):
        raise ValueError(f"refusing attribute name {key!r}")  # names come from code, never data
    return name


def _children(items: Iterable[Any]) -> Iterable[Safe]:
    for item in items:
        if item is None or item is False:
            continue
        if isinstance(item, str):
            yield esc(item)
        elif isinstance(item, Iterable):
            yield from _children(item)
        else:
            yield esc(item)


def h(tag: str, *children: Any, **attrs: Any) -> Safe:
    """``<tag attrs>children</tag>`` with every child and attribute value escaped.

    Attribute names are keyword names (``class_`` -> ``class``, ``stroke_width`` ->
    ``stroke-width``; ``viewBox`` stays as written); ``None``/``False`` values are dropped and
    ``True`` writes a bare attribute. Event-handler attributes (``on*``) are refused.
    """
    parts = [tag]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = _attr_name(key)
        parts.append(name if value is True else f'{name}="{esc(value)}"')
    opening = "<" + " ".join(parts) + ">"
    if tag in _VOID:
        return Safe(opening)
    return Safe(opening + "".join(_children(children)) + f"</{tag}>")


def join(items: Iterable[Any], sep: str = "") -> Safe:
    return Safe(esc(sep).join(_children(items)))


def short_text(v: Any) -> str:
    if isinstance(v, Mapping):
        return (
            "{"
            + ", ".join(f"{clean_text(k)}: {short_text(x)}" for k, x in v.items() if x is not None)
            + "}"
        )
    if isinstance(v, list):
        return "[" + ", ".join(short_text(x) for x in v[:8]) + (" ..." if len(v) > 8 else "") + "]"
    return fmt(v)


def fmt(v: Any, digits: int = 2) -> str:
    """A number rounded for display; anything else as text."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.{digits}f}" if v != int(v) or abs(v) >= 1e15 else str(int(v))
    return clean_text(v)


def clip(text: str, limit: int) -> str:
    text = clean_text(text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


TEXT_LIMIT = 20_000  # characters of one prompt or model output shown in the page


def preformatted(text: str, cls: str = "") -> Safe:
    text = clean_text(text)
    more = len(text) - TEXT_LIMIT
    body = text[:TEXT_LIMIT] + (f"\n... ({more} more characters not shown)" if more > 0 else "")
    return h("pre", body, class_=cls or None)


def html_table(
    head: Sequence[Any], rows: Iterable[Sequence[Any]], cls: str = "", numeric: Sequence[int] = ()
) -> Safe:
    rows = list(rows)
    if not rows:
        return Safe("")
    cells = [
        h("th", clip(c, 40), title=c if len(c) > 40 else None)
        if isinstance(c, str) and not isinstance(c, Safe)
        else h("th", c)
        for c in head
    ]
    return h(
        "div",
        h(
            "table",
            h("thead", h("tr", cells)),
            h("tbody", Safe("".join(_table_row(r, numeric) for r in rows))),
            class_=cls or None,
        ),
        class_="tw",
    )


def _table_row(row: Sequence[Any], numeric: Sequence[int]) -> str:
    """``h("tr", [h("td", c, class_="num" if i in numeric else None) ...])``, written directly:
    a run's index has a row per episode, and building each cell through :func:`h` was most of
    the time to write the report of a large run."""
    cells = []
    for i, c in enumerate(row):
        opening = '<td class="num">' if i in numeric else "<td>"
        text = esc(c) if isinstance(c, str) else "".join(_children((c,)))
        cells.append(opening + text + "</td>")
    return "<tr>" + "".join(cells) + "</tr>"


def key_values(pairs: Iterable[tuple[str, Any]]) -> Safe:
    return h("dl", [(h("dt", k), h("dd", v)) for k, v in pairs], class_="kv")
