"""Text from transcripts and scenario files made safe to print to a terminal.

Such text is untrusted (a seat's message, a scenario's name, a model's output): printed raw, an
escape sequence in it could clear, restyle or retitle the reader's terminal, move its cursor, or
forge a line of output. :func:`terminal_text` shows every C0/C1 control character but tab and
newline, DEL and the bidirectional embeddings/overrides/isolates as visible ``\\x1b``-style
escapes, and replaces lone surrogates; every printer of such text uses it (``gpumarket show``,
``replay``, ``validate``).
"""

from __future__ import annotations

import re
from typing import Any

# C0/C1 controls except tab and newline, DEL, and bidi embeddings/overrides/isolates
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_text(value: Any, newlines: bool = True) -> str:
    """``str(value)`` safe to print (see the module docstring); with ``newlines`` off, a newline
    is shown as ``\\n`` too, so a one-line message cannot forge a second line."""
    text = value if isinstance(value, str) else str(value)
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates: '?'
    text = UNSAFE.sub(_visible, text)
    return text if newlines else text.replace("\n", "\\n")


__all__ = ["UNSAFE", "terminal_text"]
