"""The console every ``gpumarket`` table is printed on: tables that fit the width they are given.

Rich cuts what does not fit: a table wider than the console loses the ends of its cells
(``frac_bi…``, ``[0.35,0…``), and when the output is not a terminal rich assumes 80 columns, so a
piped or logged table is cut too. :class:`FittingConsole` prints a table so that no number, spec
or name is ever cut or folded:

* a table that fits the console's width is printed as it is (so is one made to expand to the
  width it is given, whose columns fold by design, such as ``gpumarket show``'s);
* on a terminal too narrow for it, it is printed as records: per row, its first cell as a
  heading, then one ``column: value`` line per other cell; a value too long for its line goes on
  a line of its own, and one longer than the whole width is left whole for the terminal to wrap;
* when the output is not a terminal (piped, redirected, logged), a table is printed at its own
  width whatever the console's width, and text is not wrapped.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

#: the width a table is measured at to find its natural width (wide enough for any table)
UNBOUNDED = 1_000_000


class FittingConsole(Console):
    """A rich console whose tables fit (see the module doc); everything else prints as usual."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if any(isinstance(o, Group) for o in objects):  # a group's tables fit one by one
            for obj in objects:
                for part in obj.renderables if isinstance(obj, Group) else [obj]:
                    self.print(part, **kwargs)
            return
        if not any(isinstance(o, Table) for o in objects):
            if not self.is_terminal and all(isinstance(o, str | Text) for o in objects):
                kwargs.setdefault("soft_wrap", True)  # a log line stays one line
            super().print(*objects, **kwargs)
            return
        for obj in objects:
            if isinstance(obj, Table):
                self.print_table(obj, **kwargs)
            else:
                self.print(obj, **kwargs)

    def print_table(self, table: Table, **kwargs: Any) -> None:
        # an expanding table is laid out to the width it is given, its columns folding by design
        width = 0 if table.expand else natural_width(self, table)
        if width <= self.width:
            super().print(table, **kwargs)
        elif not self.is_terminal:
            before = self.width
            self.width = width
            try:
                super().print(table, **kwargs)
            finally:
                self.width = before
        else:
            for line in records(self, table):
                super().print(line, soft_wrap=True)


def natural_width(console: Console, table: Table) -> int:
    """The width ``table`` takes when nothing in it is wrapped or cut."""
    return Measurement.get(console, console.options.update_width(UNBOUNDED), table).maximum


def _text(console: Console, cell: RenderableType) -> Text | None:
    if isinstance(cell, Text):
        return cell
    if isinstance(cell, str):  # markup as in a table cell; no highlighting, as there
        return console.render_str(cell, highlight=False)
    return None  # another renderable: printed as it is


def records(console: Console, table: Table) -> list[RenderableType]:
    """``table`` as records for a terminal of ``console.width`` columns (see the module doc)."""
    out: list[RenderableType] = []
    if table.title:
        out.append(_text(console, table.title) or table.title)
    headers = [_text(console, c.header) or Text(str(c.header)) for c in table.columns]
    columns = [list(c.cells) for c in table.columns]
    for index, row in enumerate(table.rows):
        cells = [column[index] if index < len(column) else "" for column in columns]
        first = _text(console, cells[0])
        if first is not None:
            out.append(Text.assemble(headers[0], ": ", first, style=row.style or "bold"))
        else:
            out.append(cells[0])
        for header, cell in zip(headers[1:], cells[1:], strict=True):
            text = _text(console, cell)
            if text is None:
                out.extend([Text.assemble("  ", header, ":"), cell])
                continue
            line = Text.assemble("  ", header, ": ", text, style=row.style or "")
            if line.cell_len <= console.width:
                out.append(line)
            else:  # the value on a line of its own, never folded
                out.append(Text.assemble("  ", header, ":", style=row.style or ""))
                out.append(Text.assemble("    ", text, style=row.style or ""))
    if table.caption:
        out.append(_text(console, table.caption) or table.caption)
    return out


def terminal_console(stderr: bool = False, **kwargs: Any) -> FittingConsole:
    """The console of ``gpumarket``'s tables and messages (stdout, or stderr)."""
    return FittingConsole(stderr=stderr, **kwargs)


__all__ = ["FittingConsole", "natural_width", "records", "terminal_console"]
