"""Named SQL modules over the store's views, and which of them a store has installed.

A module is one topic of SQL (views, macros, tables) with the modules it needs, as in
Perfetto's trace-processor stdlib. Rooms above storage (``analysis``) register theirs with
``register``; storage imports none of them (the package has the analysis room imported
before the first ``Store`` is made, so registration is done before a store opens). A store
installs a module, after what it needs, when a query names anything the module defines.
Modules that only define views and macros are also installed, all of them, where the
statements to come are not known or may find a view by other means than its name: on a
cursor handed to the caller (``Store.reading``), and for a query that lists the catalog
(``SHOW TABLES``, ``duckdb_views()``, ``information_schema``) or names a table in a string
(``query_table('stage_stats')``). Binding a view costs milliseconds, so any other query
pays only for the modules it names. Modules marked ``on_demand`` wait for a query naming
them even then. A materialized module's tables are built on install
and rebuilt when its ``freshness`` query says the data under them changed; a module with a
``Setting`` (the outer-kernel rules) is configured per store, one with ``per_cursor`` set
up again on each cursor scoped to runs that needs it, and a ``computed`` one (what numpy
solves from the views, such as the clock offsets) computed again on each cursor whose
query needs it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import duckdb

from multicore_profiler.errors import StoreError

if TYPE_CHECKING:
    from multicore_profiler.storage.derived import DerivedTables

_CREATED = re.compile(
    r"(?im)^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?(?:VIEW|TABLE|MACRO)\s+(\w+)"
)
_TABLE_BUILT = re.compile(r"(?im)^\s*CREATE\s+OR\s+REPLACE\s+TABLE\s+(\w+)\s+AS\b")
_VIEW_CREATED = re.compile(
    r"(?im)^(\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?VIEW\s+\w+)\s+AS\b"
)
_NAME_TOKENS = (duckdb.token_type.identifier, duckdb.token_type.keyword)
_BY_OTHER_MEANS = frozenset(
    {
        "show",
        "describe",
        "summarize",
        "information_schema",
        "pg_catalog",
        "sqlite_master",
        "sqlite_schema",
        "duckdb_views",
        "duckdb_tables",
        "duckdb_columns",
        "duckdb_functions",
        "duckdb_dependencies",
        "show_tables",
        "show_tables_expanded",
        "table_info",
        "pragma_table_info",
        "query_table",
        "query",
    }
)
"""Names of a query that finds views without naming them: the catalog, and the table
functions that take a table's name or a query as a string."""


@dataclass(frozen=True)
class Setting:
    """How a store configures a module: the value a new store uses, how a value is
    checked (raising a ``ProfileError``), and how it is installed before the module's SQL."""

    default: Callable[[], Any]
    check: Callable[[duckdb.DuckDBPyConnection, Any], None]
    install: Callable[[duckdb.DuckDBPyConnection, Any], None]
    eager: bool = False
    """Installed with the first read, as modules of views are: for a setting whose install
    is cheap and that views of the first read need (the clock correction's table)."""


@dataclass(frozen=True)
class SqlModule:
    """One named module: its statements, the modules it needs, the tables it materializes
    (each made by one ``CREATE OR REPLACE TABLE t AS`` statement of its SQL, run again in
    this order when the result of ``freshness`` changes) and its setting, if it takes one.
    ``defines`` adds names a setting's install creates; the names its SQL creates are found
    in the SQL. ``on_demand`` makes a module of views wait for a query that names it."""

    name: str
    sql: str = ""
    needs: tuple[str, ...] = ()
    materialized: tuple[str, ...] = ()
    freshness: str | None = None
    setting: Setting | None = None
    defines: tuple[str, ...] = ()
    on_demand: bool = False
    per_cursor: Callable[[duckdb.DuckDBPyConnection], None] | None = None
    """Run on every cursor scoped to given runs whose query needs the module, before its
    SQL: for what depends on the data such a cursor sees (a temporary macro that lets DuckDB
    prune a branch). A cursor over the whole store reads only the files its query does, so
    it gets no such setup."""
    computed: Callable[[duckdb.DuckDBPyConnection], None] | None = None
    """Run on every cursor whose query needs the module, after its SQL: defines, on that
    cursor, the names (``defines``) that Python computes from the rows the cursor sees."""
    names: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        created = {name.lower() for name in _CREATED.findall(self.sql)}
        object.__setattr__(self, "names", frozenset(created | {n.lower() for n in self.defines}))

    @cached_property
    def _statements(self) -> tuple[tuple[str | None, str], ...]:
        """Its SQL's statements in order, each with the table it builds (``None`` but for
        a ``CREATE OR REPLACE TABLE ... AS``). Cut at the semicolons DuckDB's tokenizer
        finds (none in a string or a comment): a tenth of the time its parser takes to
        split them, which a command would pay for each module it installs."""
        text = self.sql.encode()  # the tokens' positions are of its UTF-8 bytes
        texts, start, code = [], 0, False
        for position, kind in duckdb.tokenize(self.sql):
            if kind == duckdb.token_type.operator and text[position : position + 1] == b";":
                if code:
                    texts.append(text[start:position].decode())
                start, code = position + 1, False
            elif kind != duckdb.token_type.comment:
                code = True
        if code:
            texts.append(text[start:].decode())
        statements = []
        for statement in texts:
            found = _TABLE_BUILT.search(statement)
            statements.append((None if found is None else found[1].lower(), statement))
        built = {table for table, _ in statements}
        missing = [table for table in self.materialized if table not in built]
        if missing:
            raise StoreError(
                f"SQL module {self.name!r} has no CREATE OR REPLACE TABLE ... AS for {missing}"
            )
        return tuple(statements)

    @cached_property
    def builds(self) -> tuple[str, ...]:
        """The statements of its SQL that make its ``materialized`` tables, in that order:
        what rebuilds them. (A view per table, built from, would bind each query twice on
        install: a tenth of an outer-kernel first query.)"""
        made = {table: text for table, text in self._statements if table is not None}
        return tuple(made[table] for table in self.materialized)

    def script(self, loads: Sequence[str]) -> str:
        """Its SQL with the statements that build its ``materialized`` tables replaced by
        ``loads`` (one per table, in that order): what installs it from kept tables."""
        made = dict(zip(self.materialized, loads, strict=True))
        return ";\n".join(
            text if table is None else made.get(table, text) for table, text in self._statements
        )

    @property
    def lazy(self) -> bool:
        """Whether it waits for a query that names it (it builds tables, takes a setting
        that is not eager, is computed or is marked on demand)."""
        return (
            bool(self.materialized)
            or (self.setting is not None and not self.setting.eager)
            or self.on_demand
            or self.computed is not None
        )


class ModuleRegistry:
    """Every registered module, by name, in registration order (needs first)."""

    def __init__(self) -> None:
        self._modules: dict[str, SqlModule] = {}

    def register(self, *modules: SqlModule) -> None:
        """Add modules; each needs only modules registered before it, and defines names no
        other module defines."""
        for module in modules:
            if module.name in self._modules:
                raise StoreError(f"SQL module {module.name!r} is registered twice")
            unknown = [need for need in module.needs if need not in self._modules]
            if unknown:
                raise StoreError(f"SQL module {module.name!r} needs unregistered {unknown}")
            for other in self._modules.values():
                shared = module.names & other.names
                if shared:
                    raise StoreError(
                        f"SQL modules {other.name!r} and {module.name!r} both define "
                        f"{sorted(shared)}"
                    )
            self._modules[module.name] = module

    def get(self, name: str) -> SqlModule:
        """The module of that name; ``StoreError`` naming the known ones if none."""
        try:
            return self._modules[name]
        except KeyError:
            raise StoreError(f"no SQL module {name!r}; known: {', '.join(self._modules)}") from None

    def eager(self) -> list[SqlModule]:
        """The modules installed wherever a view may be found by other means than its name,
        in install order: those neither lazy themselves nor needing a lazy one."""
        waiting: set[str] = set()
        for module in self._modules.values():  # a module's needs come before it
            if module.lazy or waiting.intersection(module.needs):
                waiting.add(module.name)
        return [m for m in self._modules.values() if m.name not in waiting]

    def named(self, names: set[str]) -> list[SqlModule]:
        """The modules a query of these names needs (those defining one of them, and what
        they need), in install order."""
        return self.closure(m.name for m in self._modules.values() if m.names & names)

    def closure(self, names: Iterable[str]) -> list[SqlModule]:
        """The named modules and every module they need, in registration order."""
        wanted: set[str] = set()
        stack = list(names)
        while stack:
            module = self.get(stack.pop())
            if module.name not in wanted:
                wanted.add(module.name)
                stack.extend(module.needs)
        return [m for m in self._modules.values() if m.name in wanted]

    def dependents(self, name: str) -> list[str]:
        """The module and every module that needs it, directly or not."""
        found = [name]
        for module in self._modules.values():
            if any(need in found for need in module.needs):
                found.append(module.name)
        return found


def deferred(sql: str) -> str:
    """``sql`` with every view it creates left unbound (DuckDB's ``WITH (DEFER_BINDING)``).

    DuckDB binds a view again in every query that reads it; binding it on creation as well
    only checks it, and costs what binding costs: the analyses' views over the records
    view chain take up to 0.13 s each to bind, 0.7 s all together, against 0.05 s to
    create them unbound. A view's error shows when a query reads it instead."""
    return _VIEW_CREATED.sub(r"\1 WITH (DEFER_BINDING) AS", sql)


def query_names(query: str) -> set[str]:
    """The identifiers and keywords of ``query``, lower case, as DuckDB's tokenizer reads
    them (none if it cannot): a name inside a string or a comment is not one."""
    try:
        tokens = duckdb.tokenize(query)
    except duckdb.Error:
        return set()
    names = set()
    for (start, kind), following in zip(tokens, [*tokens[1:], (len(query), None)], strict=True):
        if kind in _NAME_TOKENS:
            names.add(query[start : following[0]].strip().strip('"').lower())
    return names


REGISTRY = ModuleRegistry()
register = REGISTRY.register


class InstalledModules:
    """Which modules one store's database holds, as of which freshness, with the settings
    it uses. The caller serializes calls (the store holds its view lock)."""

    def __init__(self, registry: ModuleRegistry = REGISTRY) -> None:
        self._registry = registry
        self._installed: dict[str, Any] = {}
        self._settings: dict[str, Any] = {}

    def setting(self, name: str) -> Any:
        """The setting of a configurable module in this store (its default until set)."""
        module = self._configurable(name)
        if name not in self._settings:
            self._settings[name] = module.setting.default()
        return self._settings[name]

    def configure(self, con: duckdb.DuckDBPyConnection, name: str, value: Any | None) -> None:
        """Check and take a module's setting (``None``: its default); the module and the
        modules needing it are installed again by the next query that names them."""
        module = self._configurable(name)
        value = module.setting.default() if value is None else value
        module.setting.check(con, value)
        self._settings[name] = value
        for dependent in self._registry.dependents(name):
            self._installed.pop(dependent, None)

    def prepare(
        self,
        con: duckdb.DuckDBPyConnection,
        query: str | None = None,
        modules: Sequence[str] = (),
        *,
        scoped: bool = False,
        kept: DerivedTables | None = None,
    ) -> None:
        """Install, on ``con``, the modules ``query`` names and ``modules``, each after what
        it needs, and the eager ones unless ``query`` names every view it reads (``None``:
        a cursor for statements to come); rebuild materialized tables whose data changed,
        loading them from ``kept`` where they are kept there, and keeping them there
        where not. A cursor ``scoped`` to given runs also gets each such module's
        ``per_cursor`` setup."""
        names = None if query is None else query_names(query)
        wanted = set(modules)
        if names is None or not _BY_OTHER_MEANS.isdisjoint(names):
            wanted.update(m.name for m in self._registry.eager() if m.name not in self._installed)
        if names:
            wanted.update(m.name for m in self._registry.named(names))
        answers: dict[str, Any] = {}  # modules that share a freshness query ask it once
        for module in self._registry.closure(wanted):
            fresh = None
            if module.freshness is not None:
                if module.freshness not in answers:
                    answers[module.freshness] = con.execute(module.freshness).fetchall()
                fresh = answers[module.freshness]
            if scoped and module.per_cursor is not None:
                module.per_cursor(con)
            installed = module.name in self._installed
            if not installed and module.setting is not None:
                module.setting.install(con, self.setting(module.name))
            if not installed or fresh != self._installed[module.name]:
                self._materialize(con, module, fresh, installed, kept)
            self._installed[module.name] = fresh
            if module.computed is not None:
                module.computed(con)

    def _materialize(
        self,
        con: duckdb.DuckDBPyConnection,
        module: SqlModule,
        fresh: Any,
        installed: bool,
        kept: DerivedTables | None,
    ) -> None:
        """Run the module's SQL (``installed``: only what builds its tables), its tables
        loaded from ``kept`` where they are kept for this state of the data, else built
        and kept there."""
        key = None
        if kept is not None and module.materialized and module.freshness is not None:
            parts = [repr(fresh)]
            for need in self._registry.closure([module.name]):
                parts += [need.name, need.sql]
                if need.setting is not None:
                    parts.append(repr(self.setting(need.name)))
            key = kept.key(parts)
            loads = kept.loads(key, module.materialized)
            if loads is not None:
                try:
                    con.execute(";\n".join(loads) if installed else deferred(module.script(loads)))
                    return
                except duckdb.Error:  # removed or unreadable since: built instead
                    kept.forget(key)
        if not installed and module.sql:
            con.execute(deferred(module.sql))
        elif installed:
            for build in module.builds:
                con.execute(build)
        if key is not None and kept is not None:
            kept.save(con, key, module.materialized)

    def reads_data(self, names: set[str]) -> bool:
        """Whether a module a query of these names (``query_names``) needs builds tables
        from the store's rows or computes names from them on each cursor (what a look at
        its plan must not do)."""
        modules = self._registry.named(names)
        return any(m.materialized or m.computed is not None for m in modules)

    def _configurable(self, name: str) -> SqlModule:
        module = self._registry.get(name)
        if module.setting is None:
            raise StoreError(f"SQL module {name!r} takes no setting")
        return module
