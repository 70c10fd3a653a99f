"""Quoting of values spliced into SQL text (patterns, names), where parameters cannot go."""

from __future__ import annotations

from collections.abc import Iterable


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def sql_strings(values: Iterable[str]) -> str:
    """Comma-separated string literals, for ``IN (...)``."""
    return ", ".join(sql_string(value) for value in values)


def sql_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'
