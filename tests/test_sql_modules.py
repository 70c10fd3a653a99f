"""Which SQL modules a store installs for a query: those it names, and every module of
views where a view may be found by other means than its name."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from multicore_profiler.errors import StoreError
from multicore_profiler.storage.sql_modules import (
    REGISTRY,
    InstalledModules,
    ModuleRegistry,
    SqlModule,
)
from multicore_profiler.storage.store import Store, open_store


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


def test_a_modules_views_are_bound_by_the_queries_that_read_them() -> None:
    """Installing a module binds none of its views (binding one over the store's view chain
    costs up to a tenth of a second, and every query binds it again): a view over a table
    that is not there installs, and the query that reads it names the table."""
    registry = ModuleRegistry()
    registry.register(
        SqlModule("early", "CREATE OR REPLACE VIEW early AS\nSELECT x FROM later"),
        SqlModule("unread", "CREATE TEMP VIEW unread AS SELECT 1 AS x"),
    )
    modules = InstalledModules(registry)
    con = duckdb.connect()
    modules.prepare(con, None)
    unbound = "SELECT view_name, is_bound FROM duckdb_views() WHERE NOT internal ORDER BY ALL"
    assert con.execute(unbound).fetchall() == [("early", False), ("unread", False)]
    with pytest.raises(duckdb.CatalogException, match="Table with name later does not exist"):
        con.execute("SELECT * FROM early")
    con.execute("CREATE TABLE later AS SELECT 7 AS x")
    assert con.execute("SELECT * FROM early").fetchall() == [(7,)]
    assert con.execute(unbound).fetchall() == [("early", True), ("unread", False)]


def test_the_store_creates_its_views_unbound(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as store:
        found = store.cursor().execute(
            "SELECT view_name, is_bound FROM duckdb_views() WHERE NOT internal ORDER BY ALL"
        )
        created = dict(found.fetchall())
        assert {"raw_records", "records", "runs", "invocations"} <= set(created)
        assert [name for name, bound in created.items() if bound] == []


def test_every_view_of_the_store_and_its_modules_binds(runs: Store) -> None:
    """Views are created unbound, so a mistake in one shows only when it is read: here every
    view of the store and of every registered module is read once."""
    with runs.reading(modules=list(REGISTRY._modules)) as cursor:
        names = cursor.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY ALL"
        ).fetchall()
        assert {"records", "records_ns", "stage_stats", "step_time_breakdown"} <= {
            name for (name,) in names
        }
        for (name,) in names:
            cursor.execute(f"SELECT * FROM {name} LIMIT 0").fetchall()
        assert (
            cursor.execute(
                "SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT is_bound"
            ).fetchall()
            == []
        )


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


def test_a_materialized_table_is_built_again_by_its_own_statement_when_its_data_changes() -> None:
    """The statement that made a table is the one that makes it again: no view of the same
    query stands beside it (creating one would bind the query twice)."""
    registry = ModuleRegistry()
    registry.register(
        SqlModule(
            "totals",
            "-- Sums of the source.\nCREATE OR REPLACE TABLE totals AS\n"
            "SELECT sum(x)::BIGINT AS total FROM source;\n"
            "CREATE OR REPLACE VIEW doubled AS SELECT 2 * total AS total FROM totals;",
            materialized=("totals",),
            freshness="SELECT count(*) FROM source",
        )
    )
    modules = InstalledModules(registry)
    con = duckdb.connect()
    con.execute("CREATE TABLE source AS SELECT * FROM range(4) t(x)")
    modules.prepare(con, "SELECT total FROM doubled")
    assert con.execute("SELECT total FROM doubled").fetchall() == [(12,)]
    assert views(con) == ["doubled"]
    con.execute("INSERT INTO source VALUES (10)")
    modules.prepare(con, "SELECT total FROM doubled")
    assert con.execute("SELECT total FROM doubled").fetchall() == [(32,)]
    con.execute("UPDATE source SET x = 0 WHERE x = 10")  # the same count: not built again
    modules.prepare(con, "SELECT total FROM doubled")
    assert con.execute("SELECT total FROM doubled").fetchall() == [(32,)]


def test_a_materialized_table_without_its_statement_is_named() -> None:
    module = SqlModule(
        "broken",
        "CREATE OR REPLACE VIEW made AS SELECT 1 AS x",
        materialized=("made", "other"),
        freshness="SELECT 1",
    )
    with pytest.raises(
        StoreError, match=r"'broken' has no CREATE OR REPLACE TABLE .* \['made', 'other'\]"
    ):
        _ = module.builds


def test_a_modules_statements_are_cut_at_its_semicolons_only() -> None:
    """A semicolon in a string, a quoted name or a comment cuts no statement, text before
    it in any script (µs, —) moves no cut, and ``script`` puts each load where its
    table's build was, the rest as written."""
    sql = (
        "-- times in µs; the view — and the table\n"
        "CREATE OR REPLACE VIEW a AS SELECT 'x;y' AS \"c;d\";\n"
        "/* b; first */\nCREATE OR REPLACE TABLE b AS\nSELECT 1 AS n; -- built;\n"
        "CREATE OR REPLACE MACRO m() AS 2;\n"
    )
    module = SqlModule("cut", sql, materialized=("b",), freshness="SELECT 1")
    (build,) = module.builds
    assert build.strip() == "/* b; first */\nCREATE OR REPLACE TABLE b AS\nSELECT 1 AS n"
    con = duckdb.connect()
    con.execute(module.script(["CREATE OR REPLACE TABLE b AS SELECT 7 AS n"]))
    assert con.execute('SELECT "c;d", n, m() FROM a, b').fetchall() == [("x;y", 7, 2)]


def test_the_analyses_materialized_tables_each_have_their_statement() -> None:
    """Each table the analyses materialize is made by one statement of its module, the
    statements in the module's order (each reads the tables before it)."""
    import multicore_profiler.analysis.registry  # noqa: F401  (registers the modules)

    expected = {
        "outer_kernels.device_ops": [
            "CREATE OR REPLACE TABLE device_ops",
            "CREATE OR REPLACE TABLE op_launches",
        ],
        "outer_kernels.steps": [
            "CREATE OR REPLACE TABLE step_periods",
            "CREATE OR REPLACE TABLE kernels",
            "CREATE OR REPLACE TABLE step_islands",
        ],
        "outer_kernels.hccl_ops": ["CREATE OR REPLACE TABLE hccl_op_times"],
        "cross_rank.steps": [
            "CREATE OR REPLACE TABLE job_sources",
            "CREATE OR REPLACE TABLE rank_steps",
            "CREATE OR REPLACE TABLE job_groups",
            "CREATE OR REPLACE TABLE pipeline_chains",
            "CREATE OR REPLACE TABLE job_stages",
            "CREATE OR REPLACE TABLE rank_parallel_indices",
        ],
        "cross_rank.communication": ["CREATE OR REPLACE TABLE collective_instances"],
    }
    built = {
        name: [statement.split(" AS\n", 1)[0].rsplit("\n", 1)[-1] for statement in module.builds]
        for name in expected
        for module in [REGISTRY.get(name)]
    }
    assert built == expected
