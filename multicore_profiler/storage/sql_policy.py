"""What SQL a user's text may be: one read-only statement, or one expression.

``mcprof query``, ``export --sql`` and ``export --where`` run text a user typed over the
store's views. DuckDB would run several stacked statements, and ``COPY ... TO`` or
``ATTACH`` write anywhere, the store included. So the text is parsed first (DuckDB's
own parser and tokenizer) and refused, naming the statement type, unless it is exactly
one statement that reads: results leave only through the command's ``-o``.
"""

from __future__ import annotations

import duckdb

from multicore_profiler.errors import StatementError

_PIVOTS = ("PIVOT", "UNPIVOT")
"""Parsed as several statements (the pivot's values are looked up first), all reads."""


def _statements(text: str, what: str) -> list[duckdb.Statement]:
    try:
        return duckdb.extract_statements(text)
    except duckdb.Error as exc:
        raise StatementError(f"{what} is not valid SQL: {exc}") from None


def _first_word(text: str) -> str:
    return text.lstrip().split(None, 1)[0].upper().rstrip(";(") if text.strip() else ""


def read_only_statement(text: str, what: str = "the query") -> str:
    """``text`` if it is one read-only statement (a SELECT, WITH, VALUES, FROM, DESCRIBE,
    SHOW, SUMMARIZE, PIVOT or an EXPLAIN of one of them), else ``StatementError`` naming
    ``what`` and the statement type that was refused."""
    statements = _statements(text, what)
    if len(statements) != 1:
        raise StatementError(
            f"{what} holds {len(statements)} statements; give exactly one read-only "
            "statement (SELECT, WITH, VALUES, DESCRIBE, SHOW, EXPLAIN, SUMMARIZE or PIVOT)"
        )
    statement = statements[0]
    kind = statement.type.name
    if kind == "SELECT" or (kind == "MULTI" and _first_word(statement.query) in _PIVOTS):
        return text
    if kind == "EXPLAIN":
        read_only_statement(_explained(statement.query), what)
        return text
    raise StatementError(
        f"{what} is a statement of type {kind}, which may write or change state; only a read-only "
        "statement runs (SELECT, WITH, VALUES, DESCRIBE, SHOW, EXPLAIN, SUMMARIZE or PIVOT)"
    )


def _tokens(text: str, what: str) -> tuple[bytes, list[tuple[int, str]]]:
    """The UTF-8 bytes of ``text`` and its tokens: (byte offset, kind) from DuckDB's
    tokenizer, which counts in bytes."""
    try:
        tokens = duckdb.tokenize(text)
    except duckdb.Error as exc:
        raise StatementError(f"{what} is not valid SQL: {exc}") from None
    return text.encode(), [(position, kind.name) for position, kind in tokens]


def _explained(text: str) -> str:
    """The statement an ``EXPLAIN [ANALYZE] [(options)] ...`` explains (ANALYZE runs it)."""
    data, tokens = _tokens(text, "the EXPLAIN")
    index = 1  # past EXPLAIN
    if index < len(tokens) and data[tokens[index][0] :].upper().startswith(b"ANALYZE"):
        index += 1
    if index < len(tokens) and data[tokens[index][0] : tokens[index][0] + 1] == b"(":
        depth = 0
        while index < len(tokens):
            token = data[tokens[index][0] : tokens[index][0] + 1]
            depth += token == b"("
            depth -= token == b")"
            index += 1
            if depth == 0:
                break
    return data[tokens[index][0] :].decode() if index < len(tokens) else ""


def one_expression(text: str, what: str = "the condition") -> str:
    """``text`` if it is one SQL expression that can stand in ``WHERE (...)``: no ``;``, no
    comment, no parenthesis closed that it did not open; else ``StatementError``."""
    if not text.strip():
        raise StatementError(f"{what} is empty; give a SQL condition such as \"stage = 'GMM1'\"")
    data, tokens = _tokens(text, what)
    ends = [position for position, _ in tokens[1:]] + [len(data)]
    depth = 0
    for (position, kind), end in zip(tokens, ends, strict=True):
        at = len(data[:position].decode(errors="ignore"))
        if kind == "comment":
            raise StatementError(f"{what} holds a comment at character {at}; leave it out")
        if kind != "operator":
            continue
        for offset, char in enumerate(data[position:end].rstrip()):
            if char == ord(";"):
                raise StatementError(
                    f"{what} holds a ';' at character {at + offset}: it must be one expression"
                )
            depth += char == ord("(")
            depth -= char == ord(")")
            if depth < 0:
                raise StatementError(
                    f"{what} closes a parenthesis it did not open at character {at + offset}: "
                    "it must be one expression"
                )
    if depth:
        raise StatementError(f"{what} leaves {depth} parenthesis(es) open")
    # The whole text must parse as the condition of one SELECT, and as nothing else.
    read_only_statement(f"SELECT 1 WHERE ({text}\n)", what)
    return text
