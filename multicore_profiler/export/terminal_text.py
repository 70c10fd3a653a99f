"""Text for a terminal: stored names can hold any character, and a control character
printed raw (ESC starts a terminal's escape sequence; CR, BS and NEL move the cursor)
would let a name redraw the screen. Shown escaped, as DuckDB's tables (``mcprof query``,
``mcprof runs``) show them: ``\\e``, ``\\n``, ``\\t`` and the other C escapes by letter,
the rest of C0, DEL and C1 as ``\\xNN``."""

from __future__ import annotations

_BY_LETTER = {0: "\\0", 7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r"}
_BY_LETTER[27] = "\\e"
_ESCAPES = {
    code: _BY_LETTER.get(code, f"\\x{code:02x}") for code in (*range(0x20), *range(0x7F, 0xA0))
}
"""Each control character (C0, DEL, C1) and how it shows."""


def printable(text: str) -> str:
    """``text`` with every control character escaped (see the module docstring)."""
    return text.translate(_ESCAPES)
