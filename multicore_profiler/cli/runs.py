"""``mcprof runs`` (the runs of the store) and ``mcprof query`` (SQL over its views)."""

from __future__ import annotations

import argparse

import pyarrow as pa

from multicore_profiler.cli.arguments import Parents, open_given_store, outer_kernel_rules
from multicore_profiler.cli.output import emit
from multicore_profiler.storage.arrow_values import strings
from multicore_profiler.storage.runs import CAPTURE_COLUMNS, CaptureCost
from multicore_profiler.storage.sql_policy import read_only_statement

_RUNS = f"""SELECT s.*, {", ".join(f"r.{c}" for c in CAPTURE_COLUMNS)}
FROM run_summary s JOIN runs r USING (run_id)
WHERE $runs IS NULL OR list_contains($runs, run_id)
ORDER BY s.start_time, run_id"""


def cmd_runs(args: argparse.Namespace) -> None:
    """Print the runs' summaries with what profiling cost them, oldest first, or those
    ``--select`` picks: as a table, the cost per recorded step; otherwise its raw columns."""
    store = open_given_store(args)
    selected = None if args.select is None else store.select_runs(args.select)
    table = store.sql(_RUNS, {"runs": selected})
    emit(
        _cost_per_step(table) if args.format == "table" else table, args.format, args.output, store
    )


def _cost_per_step(table: pa.Table) -> pa.Table:
    """``table`` with its ``capture_*`` columns as two for people: the milliseconds of the
    job's thread and of the writer's CPU per recorded step (``0.31``, ``1.2``), blank for a
    run without a cost. Two short columns, as the box table cuts long cells."""
    job, writer = [], []
    for row in table.select(list(CAPTURE_COLUMNS)).to_pylist():
        cost = CaptureCost.of_row(row)
        per_step = (None if cost is None else cost.per_step_ms()) or ("", "")
        job.append(per_step[0])
        writer.append(per_step[1])
    table = table.drop_columns(list(CAPTURE_COLUMNS))
    table = table.append_column("job ms/step", strings(job))
    return table.append_column("writer CPU ms/step", strings(writer))


def cmd_query(args: argparse.Namespace) -> None:
    """Print the rows of one read-only statement, scoped to the runs given if any."""
    # Checked before the store opens: rows leave through -o only.
    read_only_statement(args.sql, "the query")
    store = open_given_store(args)
    store.use_kernel_rules(outer_kernel_rules(args))
    runs = list(args.run) + (store.select_runs(args.select) if args.select else [])
    emit(store.sql(args.sql, runs=runs or None), args.format, args.output, store)


def register(commands: argparse._SubParsersAction, parents: Parents) -> None:
    """Add ``runs`` and ``query`` to ``commands``."""
    runs = commands.add_parser("runs", parents=[parents.store, parents.output])
    runs.add_argument(
        "--select",
        metavar="SELECTOR",
        help="only these runs, e.g. branch:main,latest:5 or commit:3f2a,tag:model=moe-7b",
    )
    runs.set_defaults(func=cmd_runs)

    query = commands.add_parser(
        "query",
        parents=[parents.store, parents.output, parents.rules],
    )
    query.add_argument("sql", help='e.g. "SELECT * FROM stage_stats"')
    query.add_argument(
        "--run",
        action="append",
        default=[],
        help="scope the query to this run (repeatable): it reads only its files",
    )
    query.add_argument(
        "--select",
        metavar="SELECTOR",
        help="scope the query to the runs a selector picks (label:nightly, commit:abc, ...)",
    )
    query.set_defaults(func=cmd_query)
