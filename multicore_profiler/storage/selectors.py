"""Run selectors: which runs of a store a listing, a comparison or a report is about (and
which of its outer traces, with the keys that apply to them).

A selector is text, the same in Python and on the command line: comma-separated terms
``key:value``. Terms of one key are alternatives, terms of different keys all apply:

- ``run:<id>`` (or a bare run id), ``commit:<prefix>``, ``branch:<name>``, ``label:<label>``;
- ``tag:<key>=<value>`` (every tag term must hold);
- ``since:<time>``, ``until:<time>``: the run's start, ISO 8601 (``2026-11-30`` or
  ``2026-11-30T08:00``; UTC unless it says otherwise, as ``Z`` or ``+01:00`` do), since
  inclusive, until exclusive;
- ``latest:<N>``: of the runs the other terms select, the N that started last (N from 1 to
  2^63 - 1).

Every term is checked here, when the text is read: a bad one is a ``SelectorError`` naming
the term, never an error of the query it would have made.

``branch:main,latest:5`` is the five latest runs on main; ``commit:3f2a,commit:9c1e`` the runs
of either commit. A selector that selects no run, or names an alternative no run of the store
has (``commit:3f2a,commit:ffff``), is a ``SelectorError`` naming it (``Store.select_runs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from multicore_profiler.errors import ArgumentError, SelectorError
from multicore_profiler.limits import COUNT

_KEYS = ("run", "commit", "branch", "label", "tag", "since", "until", "latest")
_LATEST = replace(COUNT, low=1)
"""``latest:N``: a count of runs that SQL's ``LIMIT`` (a BIGINT) takes."""


def _latest(text: str, term: str) -> int:
    try:
        return int(_LATEST.parse(text, "latest"))
    except ArgumentError as exc:
        raise SelectorError(f"selector term {term!r}: latest takes a count >= 1: {exc}") from None


def _time(text: str, key: str) -> datetime:
    # A "Z" for UTC, which Python 3.10's fromisoformat refuses and 3.11's takes: the same
    # selector must select the same runs on every Python the project supports.
    written = f"{text[:-1]}+00:00" if text.endswith("Z") else text
    try:
        moment = datetime.fromisoformat(written)
    except ValueError as exc:
        raise SelectorError(
            f"{key}:{text} is not an ISO 8601 date or time (e.g. 2026-11-30T08:00)"
        ) from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class RunSelector:
    """A parsed selector (see the module's doc); ``RunSelector.parse(text)`` reads one."""

    runs: tuple[str, ...] = ()
    commits: tuple[str, ...] = ()
    branches: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    latest: int | None = None
    text: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text: str) -> RunSelector:
        """Read a selector; ``SelectorError`` names a term that is not one."""
        found: dict[str, list[Any]] = {key: [] for key in _KEYS}
        terms = [term.strip() for term in text.split(",")]
        if not text.strip() or not all(terms):
            raise SelectorError(f"selector {text!r} has an empty term")
        for term in terms:
            key, sep, value = term.partition(":")
            if not sep:
                key, value = "run", term
            if key not in _KEYS:
                raise SelectorError(
                    f"selector term {term!r}: unknown key {key!r}; one of {', '.join(_KEYS)}"
                )
            if not value:
                raise SelectorError(f"selector term {term!r} has no value")
            if key == "tag":
                name, equals, tag_value = value.partition("=")
                if not equals or not name:
                    raise SelectorError(f"selector term {term!r}: a tag is tag:KEY=VALUE")
                found[key].append((name, tag_value))
            elif key in ("since", "until"):
                found[key].append(_time(value, key))
            elif key == "latest":
                found[key].append(_latest(value, term))
            else:
                found[key].append(value)
        for key in ("since", "until", "latest"):
            if len(found[key]) > 1:
                raise SelectorError(f"selector {text!r} gives {key} more than once")
        return cls(
            runs=tuple(found["run"]),
            commits=tuple(found["commit"]),
            branches=tuple(found["branch"]),
            labels=tuple(found["label"]),
            tags=tuple(found["tag"]),
            since=found["since"][0] if found["since"] else None,
            until=found["until"][0] if found["until"] else None,
            latest=found["latest"][0] if found["latest"] else None,
            text=text,
        )

    def sql(self, of: str = "runs") -> tuple[str, dict[str, Any]]:
        """A query of the selected ids, oldest first, and its parameters: of runs (the
        ``runs`` view), or of traces (``trace_sources``: ``run:`` names a source id, times
        are when it was ingested, and there is no commit or branch)."""
        table, id_column, time_column = self._table(of)
        conditions: list[str] = []
        params: dict[str, Any] = {}

        def any_of(column: str, values: tuple[str, ...], test: str) -> None:
            if not values:
                return
            names = []
            for index, value in enumerate(values):
                name = f"{column}_{index}"
                params[name] = value
                names.append(test.format(column=column, value=f"${name}"))
            conditions.append("(" + " OR ".join(names) + ")")

        any_of(id_column, self.runs, "{column} = {value}")
        any_of("commit", self.commits, "starts_with({column}, {value})")
        any_of("branch", self.branches, "{column} = {value}")
        any_of("label", self.labels, "{column} = {value}")
        for index, (key, value) in enumerate(self.tags):
            params[f"tag_key_{index}"], params[f"tag_value_{index}"] = key, value
            conditions.append(f"tags[$tag_key_{index}] = $tag_value_{index}")
        if self.since is not None:
            params["since"] = self.since
            conditions.append(f"{time_column} >= $since")
        if self.until is not None:
            params["until"] = self.until
            conditions.append(f"{time_column} < $until")
        where = " AND ".join(conditions) or "true"
        limit = f" LIMIT {self.latest}" if self.latest is not None else ""
        query = (
            f"SELECT {id_column} AS id FROM (SELECT {id_column}, {time_column} FROM {table} "
            f"WHERE {where} ORDER BY {time_column} DESC, {id_column} DESC{limit}) "
            f"ORDER BY {time_column}, {id_column}"
        )
        return query, params

    def absent_sql(self, of: str = "runs") -> tuple[str, dict[str, Any]]:
        """A query of the alternatives (``run:``, ``commit:``, ``branch:``, ``label:``)
        that no run (or trace, ``of="traces"``) has at all, in the selector's order, as a
        ``term`` column, and its parameters: a selector whose other alternatives select
        runs still names none that is not there. (A tag term, which every run must hold,
        that none holds selects nothing.)"""
        table, id_column, _ = self._table(of)
        tests = [
            (self.runs, f"{id_column} = $value_{{index}}"),
            (self.commits, "starts_with(commit, $value_{index})"),
            (self.branches, "branch = $value_{index}"),
            (self.labels, "label = $value_{index}"),
        ]
        keys = ("run", "commit", "branch", "label")
        terms: list[str] = []
        params: dict[str, Any] = {}
        for key, (values, test) in zip(keys, tests, strict=True):
            for value in values:
                index = len(terms)
                params[f"value_{index}"] = value
                terms.append(
                    f"SELECT {index} AS n, $term_{index} AS term WHERE NOT EXISTS "
                    f"(SELECT 1 FROM {table} WHERE {test.format(index=index)})"
                )
                params[f"term_{index}"] = f"{key}:{value}"
        union = "\nUNION ALL\n".join(terms) or "SELECT 0 AS n, NULL::VARCHAR AS term WHERE false"
        return f"SELECT term FROM ({union}) ORDER BY n", params

    def absent_error(self, terms: list[str], where: str, of: str = "runs") -> SelectorError:
        """The error of a selector whose ``terms`` (``absent_sql``) name nothing of ``where``."""
        kind = "run" if of == "runs" else "trace"
        verb = "names" if len(terms) == 1 else "name"
        return SelectorError(f"selector {self}: {', '.join(terms)} {verb} no {kind} in {where}")

    def _table(self, of: str) -> tuple[str, str, str]:
        """The table, id column and time column of runs or traces (which have no commit or
        branch: ``SelectorError`` for a selector naming one)."""
        if of != "traces":
            return "runs", "run_id", "start_time"
        if self.commits or self.branches:
            raise SelectorError(f"selector {self}: traces have no commit or branch")
        return "trace_sources", "source_id", "ingested_at"

    def __str__(self) -> str:
        return self.text or "(every run)"
