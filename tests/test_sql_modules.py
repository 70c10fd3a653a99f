"""Which SQL modules a store installs for a query: those it names, and every module of
views where a view may be found by other means than its name."""

from __future__ import annotations

import duckdb
import pytest

from multicore_profiler.storage.sql_modules import InstalledModules, ModuleRegistry, SqlModule


@pytest.fixture
def modules() -> InstalledModules:
    registry = ModuleRegistry()
    registry.register(
        SqlModule("base", "CREATE VIEW base AS SELECT 1 AS x"),
        SqlModule("double", "CREATE VIEW double AS SELECT 2 * x AS x FROM base", needs=("base",)),
        SqlModule("other", "CREATE VIEW other AS SELECT 3 AS x"),
        SqlModule("costly", "CREATE VIEW costly AS SELECT 4 AS x", on_demand=True),
    )
    return InstalledModules(registry)


def views(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [
        name
        for (name,) in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
        ).fetchall()
    ]


def test_a_query_installs_only_the_modules_it_names(modules: InstalledModules) -> None:
    con = duckdb.connect()
    modules.prepare(con, "SELECT x FROM double -- other")
    assert views(con) == ["base", "double"]
    modules.prepare(con, "SELECT 'other' AS name")
    assert views(con) == ["base", "double"]
    modules.prepare(con, "SELECT x FROM costly")
    assert views(con) == ["base", "costly", "double"]


@pytest.mark.parametrize(
    "query",
    [
        "SHOW TABLES",
        "DESCRIBE",
        "PRAGMA show_tables",
        "SELECT view_name FROM duckdb_views()",
        "SELECT table_name FROM information_schema.tables",
        "SELECT * FROM query_table('other')",
        "SELECT * FROM pragma_table_info('other')",
    ],
)
def test_a_query_that_finds_views_otherwise_installs_every_module_of_views(
    modules: InstalledModules, query: str
) -> None:
    con = duckdb.connect()
    modules.prepare(con, query)
    assert views(con) == ["base", "double", "other"]


def test_a_cursor_for_statements_to_come_gets_every_module_of_views(
    modules: InstalledModules,
) -> None:
    con = duckdb.connect()
    modules.prepare(con, None, ["costly"])
    assert views(con) == ["base", "costly", "double", "other"]


def test_a_cursor_for_a_known_statement_gets_its_modules_and_those_named(
    modules: InstalledModules,
) -> None:
    """Work that says its statement (an export's timeline, an analysis) gets the modules
    it names and those the statement names, not every module of views."""
    con = duckdb.connect()
    modules.prepare(con, "SELECT x FROM costly", ["double"])
    assert views(con) == ["base", "costly", "double"]
    modules.prepare(con, "SHOW TABLES", ["double"])
    assert views(con) == ["base", "costly", "double", "other"]
