"""``mcprof``: the command line over a store.

Every command takes ``--store PATH`` (default ``$MCPROF_STORE`` or ``./mcprof-store``).
Errors print one line, ``mcprof: error: ...``, and exit with status 1; a usage error (an
unknown option, a missing argument, a value that is not a number or out of its range)
exits with status 2 (``compare``'s errors all exit with 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa
from tqdm import tqdm

from multicore_profiler.abi import BufferLayout
from multicore_profiler.analysis.compare import LEVELS, VERDICTS, Comparison
from multicore_profiler.analysis.outer_kernel_rules import KernelRules
from multicore_profiler.errors import (
    ArgumentError,
    DroppedRecordsWarning,
    FuseError,
    ProfileError,
)
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.fuse.merge import merge_chrome_traces
from multicore_profiler.ingest.buffers import KernelInfo, Launches, ingest_buffers
from multicore_profiler.ingest.decode import decode_buffers, read_buffer_file
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.ingest.schedule import schedule
from multicore_profiler.limits import (
    COUNT,
    DAYS,
    DESC_ID,
    DEVICE,
    FREQUENCY_MHZ,
    HOURS,
    INVOCATION_ID,
    PID,
    RANK,
    SLOTS,
    STEP,
    WINDOW,
    Range,
)
from multicore_profiler.storage.check import check_store
from multicore_profiler.storage.location import os_reason
from multicore_profiler.storage.partitions import check_run_id
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.sql_policy import read_only_statement
from multicore_profiler.storage.sql_text import sql_identifier, sql_string
from multicore_profiler.storage.store import Store, default_store_path, open_store
from multicore_profiler.storage.vacuum import GRACE

FORMATS = ("table", "csv", "json", "parquet")

THRESHOLD = Range("a relative change of the median", 0, 100, integer=False)
"""``compare --threshold``: 0 (any significant change) to 100 (a 100-fold change)."""
ALPHA = Range("a significance level", 1e-9, 0.5, integer=False)
"""``compare --alpha``: a p-value cut above 0.5 would call noise a change."""
DEMO_STEPS = Range("a step count", 3, COUNT.high)
"""``demo --steps``: the schedule records from step 2 on, so fewer record nothing."""
LAUNCHES = Range("a launch count", 1, COUNT.high)
SEED = Range("a seed", 0, 2**64 - 1)
"""``demo --seed``: what ``torch.Generator.manual_seed`` takes."""


def _one_line(text: str) -> str:
    """A message as one line: its non-empty lines joined by ``; ``."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _text(text: str) -> str:
    """The ``type`` of every argument that names none: the text as given, if it is text.
    An argument that is not valid UTF-8 reaches Python with lone surrogates, which no SQL,
    selector, name or label can hold (file paths, ``_path``, may)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not valid UTF-8 text (at character {exc.start})"
        ) from None
    return text


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, ``mcprof: error: ...`` (exit 2),
    like every other error: not the usage block and the subcommand's name; an argument
    without a ``type`` is read by ``_text``. Subparsers are made of the same class
    (``add_subparsers`` takes the parser's own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("type", None, _text)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"mcprof: error: {_one_line(message)}\n")


def _in(limits: Range) -> Callable[[str], int | float]:
    """An argparse ``type`` reading a number of ``limits``: a value outside it is a usage
    error naming the option, the value and the range."""

    def parse(text: str) -> int | float:
        try:
            return limits.parse(text)
        except ArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _location(text: str) -> str:
    """An argparse ``type`` for a store or file location: not empty (which would mean the
    working directory) and without NUL bytes (which no file name holds)."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a path or URI")
    return text


def _store_location(text: str) -> str:
    """An argparse ``type`` for ``--store``: a location (``_location``) that is text, as
    DuckDB reads the store's files by their names."""
    return _text(_location(text))


def _path(text: str) -> Path:
    """An argparse ``type`` for a file argument, checked as ``_location``."""
    return Path(_location(text))


def _stage(text: str) -> tuple[int, str]:
    """An argparse ``type`` reading ``DESC_ID=NAME`` (the id decimal or ``0x...``)."""
    desc, sep, name = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            f"a stage is DESC_ID=NAME (e.g. 0x30001=GMM1), got {text!r}"
        )
    return int(_in(DESC_ID)(desc)), _text(name)


def _emit(table: pa.Table, fmt: str, output: Path | None) -> None:
    """Print or write query rows: a box table, CSV, a JSON array, or Parquet (to a file)."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.register("result", table)
    if fmt == "table":
        if output is not None:
            raise ProfileError(
                "--format table prints to the terminal; pick csv, json or parquet for -o"
            )
        width = shutil.get_terminal_size((160, 40)).columns
        con.sql("SELECT * FROM result").show(max_width=width, max_rows=max(table.num_rows, 1))
        return
    if fmt == "parquet" and output is None:
        raise ProfileError("--format parquet writes a binary file: give one with -o FILE")
    options = {
        "csv": "FORMAT csv, HEADER",
        "json": "FORMAT json, ARRAY true",
        "parquet": "FORMAT parquet",
    }
    with tempfile.TemporaryDirectory(prefix="mcprof-") as scratch:
        target = output if output is not None else Path(scratch) / f"result.{fmt}"
        try:
            con.execute(
                f"COPY (SELECT * FROM result) TO $target ({options[fmt]})", {"target": str(target)}
            )
        except duckdb.Error as exc:
            raise ProfileError(f"cannot write {target}: {exc}") from exc
        if output is None:
            sys.stdout.flush()
            with open(target, "rb") as rows:
                shutil.copyfileobj(rows, sys.stdout.buffer)
            sys.stdout.buffer.flush()


def _store(args: argparse.Namespace, *, create: bool = False) -> Store:
    return open_store(args.store, create=create)


def cmd_runs(args: argparse.Namespace) -> None:
    store = _store(args)
    selected = None if args.select is None else store.select_runs(args.select)
    table = store.sql(
        "SELECT * FROM run_summary WHERE $runs IS NULL OR list_contains($runs, run_id) "
        "ORDER BY start_time, run_id",
        {"runs": selected},
    )
    _emit(table, args.format, args.output)


def _kernel_rules(args: argparse.Namespace) -> KernelRules:
    rules = KernelRules() if args.rules is None else KernelRules.load(args.rules)
    return rules if args.steps is None else dataclasses.replace(rules, steps=args.steps)


def cmd_query(args: argparse.Namespace) -> None:
    # One read-only statement, checked before the store opens: rows leave through -o only.
    read_only_statement(args.sql, "the query")
    store = _store(args)
    store.use_kernel_rules(_kernel_rules(args))
    runs = list(args.run) + (store.select_runs(args.select) if args.select else [])
    _emit(store.sql(args.sql, runs=runs or None), args.format, args.output)


def _trace_source(store: Store, item: str, args: argparse.Namespace) -> str:
    """The source id of a trace file (loaded into the store if new) or of a source id (or
    a unique prefix of one) already in the store."""
    path = Path(item)
    if path.is_file():
        source = ingest_trace(store, path, rank=args.rank, label=args.label)
        if source.new:
            print(f"{source.source_id}  {path}: {source.events} events loaded", file=sys.stderr)
        return source.source_id
    found = store.sql(
        "SELECT source_id FROM trace_sources WHERE starts_with(source_id, $1) ORDER BY 1",
        [item.lower()],
    )["source_id"].to_pylist()
    if len(found) != 1 or len(item) < 4:
        problem = "names several" if len(found) > 1 else "is neither a trace file nor"
        raise ProfileError(f"{item!r} {problem} the source id of a trace in {store.uri}")
    return found[0]


def _check_steps(store: Store, source_id: str) -> None:
    """Raise when a trace has no step with a GPU period, saying what was found instead."""
    if store.sql("SELECT 1 FROM steps WHERE source_id = $1", [source_id]).num_rows:
        return
    pattern = store.kernel_rules.steps
    annotations = store.sql(
        "SELECT count(*) AS n FROM step_annotations WHERE source_id = $1", [source_id]
    ).to_pylist()[0]["n"]
    raise ProfileError(
        f"trace {source_id} has no step with a GPU period: {annotations} annotation(s) "
        f"match the step pattern '{pattern}'; a step needs device kernels launched from inside "
        "its annotation and a next step (the last one is dropped); give --steps REGEX"
    )


def cmd_kernels(args: argparse.Namespace) -> None:
    store = _store(args, create=True)
    store.use_kernel_rules(_kernel_rules(args))
    sources = list(dict.fromkeys(_trace_source(store, item, args) for item in args.traces))
    for source_id in sources:
        _check_steps(store, source_id)
    where = {"sources": sources}
    order = store.sql(
        """SELECT family FROM step_family_totals WHERE list_contains($sources, source_id)
           GROUP BY family ORDER BY sum(union_ns) DESC, family""",
        where,
    )["family"].to_pylist()
    columns = ", ".join(
        f"round(sum(f.union_ns) FILTER (WHERE f.family = {sql_string(family)}) / 1e6, 3) "
        f"AS {sql_identifier(family + '_ms')}"
        for family in order
    )
    table = store.sql(
        f"""SELECT s.source_id, s.rank, s.step_index AS step, s.step_name AS annotation,
                   round(s.period_ns / 1e6, 3) AS period_ms,
                   round(100 * s.busy_ns / s.period_ns, 1) AS busy_pct, {columns}
            FROM steps s JOIN step_family_totals f USING (source_id, step_index)
            WHERE list_contains($sources, s.source_id)
            GROUP BY 1, 2, 3, 4, 5, 6
            ORDER BY list_position($sources, s.source_id), s.step_index""",
        where,
    )
    _emit(table, args.format, args.output)


def _markdown(comparison: Comparison) -> str:
    """A comparison as a Markdown summary and table, for a pull-request comment."""
    lines = [
        f"**mcprof compare**: {comparison.summary()}",
        "",
        f"base `{comparison.base}` ({len(comparison.base_ids)} run(s)), "
        f"head `{comparison.head}` ({len(comparison.head_ids)} run(s))",
        "",
    ]
    lines += [f"> warning: {warning}" for warning in comparison.warnings]
    header = [*comparison.by, "base median (us)", "head median (us)", "change", "interval", "p"]
    header += ["verdict", "added (us/invocation)"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def us(value: float | None) -> str:
        return "" if value is None else f"{value / 1e3:.2f}"

    def pct(value: float | None) -> str:
        return "" if value is None else f"{value:+.1%}"

    for row in comparison.rows.to_pylist():
        low, high = row["change_low"], row["change_high"]
        interval = "" if low is None else f"{pct(low)} .. {pct(high)}"
        cells = [str(row[column]) for column in comparison.by]
        cells += [us(row["base_median_ns"]), us(row["head_median_ns"]), pct(row["change"])]
        cells += [interval, "" if row["p_value"] is None else f"{row['p_value']:.2g}"]
        verdict = f"**{row['verdict']}**" if row["verdict"] == "regressed" else row["verdict"]
        cells += [verdict, us(row["impact_ns"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _comparison_json(comparison: Comparison) -> bytes:
    document = {
        "base": {"selector": comparison.base, "runs": list(comparison.base_ids)},
        "head": {"selector": comparison.head, "runs": list(comparison.head_ids)},
        "by": list(comparison.by),
        "metric": comparison.metric,
        "threshold": comparison.threshold,
        "alpha": comparison.alpha,
        "counts": {verdict: comparison.count(verdict) for verdict in VERDICTS},
        "warnings": list(comparison.warnings),
        "groups": comparison.rows.to_pylist(),
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"


def cmd_compare(args: argparse.Namespace) -> int:
    store = _store(args)
    comparison = store.compare(
        args.base,
        args.head,
        level=args.level,
        by=None if args.by is None else [column.strip() for column in args.by.split(",")],
        threshold=args.threshold,
        alpha=args.alpha,
    )
    for warning in comparison.warnings:
        print(f"mcprof: warning: {warning}", file=sys.stderr)
    if args.plot is not None:
        from multicore_profiler.export.compare_plot import plot_comparison  # matplotlib

        print(f"mcprof: picture: {plot_comparison(comparison, args.plot)}", file=sys.stderr)
    if args.format in ("json", "markdown"):
        text = (
            _comparison_json(comparison)
            if args.format == "json"
            else _markdown(comparison).encode()
        )
        if args.output is None:
            sys.stdout.buffer.write(text)
        else:
            args.output.write_bytes(text)
    elif args.format == "csv":
        _emit(comparison.rows, "csv", args.output)
    else:
        if args.output is not None:
            raise ProfileError("--format table prints to the terminal; pick csv, json or markdown")
        print(f"mcprof compare: {comparison.summary()}")
        con = duckdb.connect()
        con.register("rows", comparison.rows)
        shown = con.sql(
            f"""SELECT {", ".join(sql_identifier(c) for c in comparison.by)},
                       base_count AS base_n, head_count AS head_n,
                       round(base_median_ns / 1e3, 2) AS base_us,
                       round(head_median_ns / 1e3, 2) AS head_us,
                       printf('%+.1f%%', change * 100) AS change,
                       printf('%+.1f%% .. %+.1f%%', change_low * 100, change_high * 100)
                           AS interval,
                       printf('%.2g', p_value) AS p, verdict,
                       round(impact_ns / 1e3, 2) AS added_us_per_invocation
                FROM rows""",
        ).to_arrow_table()
        _emit(shown, "table", None)
    return 1 if args.fail_on_regression and comparison.regressed else 0


def cmd_report(args: argparse.Namespace) -> None:
    from multicore_profiler.export.report import write_report

    path = write_report(
        _store(args), args.run, args.output, base=args.base, invocation=args.invocation
    )
    print(f"{path}: report of {args.run}" + (f" against {args.base}" if args.base else ""))


def _stage_names(pairs: Sequence[tuple[int, str]]) -> dict[int, str]:
    """The ``--stage`` names by desc id; an id named twice, differently, is refused."""
    names: dict[int, str] = {}
    for desc, name in pairs:
        if names.setdefault(desc, name) != name:
            raise ArgumentError(
                f"--stage names desc id {desc:#x} twice: {names[desc]!r} and {name!r}"
            )
    return names


def cmd_ingest_buffer(args: argparse.Namespace) -> None:
    layout = BufferLayout(args.aic_slots, args.aiv_slots, args.aic_capacity, args.aiv_capacity)
    kernel = KernelInfo(
        kernel_name=args.kernel,
        owner_label=args.owner_label,
        stage_names=_stage_names(args.stage),
        soc=args.soc,
    )
    run_id = args.run and check_run_id(args.run)
    # Read (regular files only, in bounded time) and decode before the store is touched.
    frequency_hz = args.freq_mhz * 1e6
    decoded = decode_buffers(
        [read_buffer_file(path, layout) for path in args.files], layout, frequency_hz=frequency_hz
    )
    store = _store(args, create=True)
    known = (
        run_id is not None and store.sql("SELECT 1 FROM runs WHERE run_id = $1", [run_id]).num_rows
    )
    run = None if known else RunInfo.begin(run_id=run_id, label=args.label)
    run_id = run_id if run is None else run.run_id
    step = ingest_buffers(
        store,
        decoded,
        layout,
        frequency_hz=frequency_hz,
        run_id=run_id,
        kernel=kernel,
        launches=Launches(
            rank=args.rank,
            device=args.device,
            step=args.step,
            first_invocation_id=args.invocation,
            direction=args.direction,
        ),
        new_run=run,
    )
    print(
        f"run {run_id}: {decoded.buffers} invocation(s) from id {step.first_invocation_id}, "
        f"{int(decoded.record_counts.sum())} records, {int(decoded.dropped_counts.sum())} dropped"
    )


def cmd_check(args: argparse.Namespace) -> int:
    """Print each problem of the store's files as ``<file>: <check>: <reason>`` and the
    summary on standard error; status 1 when a check failed."""
    report = check_store(_store(args), args.run or None)
    for problem in report.problems:
        print(_one_line(str(problem)))
    print(report.summary(), file=sys.stderr)
    return 0 if report.ok else 1


def cmd_compact(args: argparse.Namespace) -> None:
    report = _store(args).compact(args.run or None, grace=timedelta(hours=args.grace))
    print(
        f"compacted {report.runs} run(s): {report.files_before} files in {report.partitions} "
        f"partition(s) merged into {report.files_after} ({report.rows} rows)"
        + (
            f"; {report.uncommitted_files} uncommitted file(s) left alone"
            if report.uncommitted_files
            else ""
        )
        + (f"; {report.files_deleted} dead file(s) deleted" if report.files_deleted else "")
    )


def cmd_gc(args: argparse.Namespace) -> None:
    older = None if args.older_than is None else timedelta(days=args.older_than)
    plan = _store(args, create=False).gc(
        keep_last=args.keep_last, older_than=older, labels=args.label, apply=args.apply
    )
    columns = ["run_id", "label", "commit", "status", "start_time", "updated_at", "files", "bytes"]
    rows = pa.Table.from_pylist(plan.runs) if plan.runs else None
    if rows is not None:
        _emit(rows.select(columns), args.format, args.output)
    print(plan.summary(), file=sys.stderr)


def cmd_export(args: argparse.Namespace) -> None:
    trace = export_chrome_trace(
        _store(args),
        args.output,
        run=args.run or None,
        step=args.step,
        invocation=args.invocation,
        rank=args.rank,
        window=args.window,
        where=args.where,
        query=args.sql,
        detailed_task_names=args.detailed,
    )
    for warning in trace.metadata["warnings"]:
        print(f"mcprof: warning: {warning}", file=sys.stderr)
    print(
        f"{trace.path}: {trace.events} events ({trace.records} records of "
        f"{trace.metadata['invocationCount']} invocation(s), {trace.flows} dependency arrows) "
        f"from {trace.metadata['selection']}"
    )


def _tags(pairs: Sequence[str]) -> dict[str, str]:
    tags = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ProfileError(f"--tag {pair!r} is not KEY=VALUE")
        tags[key] = value
    return tags


def cmd_ingest_trace(args: argparse.Namespace) -> None:
    store = _store(args, create=True)
    tags = _tags(args.tag)
    for path in args.files:
        source = ingest_trace(store, path, rank=args.rank, label=args.label, tags=tags)
        state = "loaded" if source.new else "already in the store"
        rank = "" if source.rank is None else f", rank {source.rank}"
        print(f"{source.source_id}  {path}: {source.events} events{rank} ({state})")


def cmd_fuse(args: argparse.Namespace) -> None:
    if args.trace is not None:
        store = open_store(args.store) if args.store is not None else None
        mega_kernel = args.trace
    else:
        store = open_store(args.store or default_store_path(), create=False)
        mega_kernel = store
    merged = merge_chrome_traces(
        args.torch_trace,
        mega_kernel,
        args.output,
        store=store,
        run=args.run,
        step=args.step,
        window=args.window,
        rank=args.rank,
        kernel_pattern=args.kernel_pattern,
        kernel_index=args.kernel_index,
        outer_pid=args.outer_pid,
        allow_host_alignment=args.allow_host_alignment,
        rebase_timestamps=args.rebase,
    )
    report = merged.report
    for warning in report["warnings"]:
        print(f"mcprof: warning: {warning}", file=sys.stderr)
    counts = report["counts"]
    first = report["invocations"][0]["outerKernel"]
    name = first["name"] if len(first["name"]) <= 60 else first["name"][:57] + "..."
    print(
        f"{merged.path}: {merged.records} records of {counts['invocations']} invocation(s) "
        f"({merged.added_events} events with threads and arrows) on {counts['addedThreads']} "
        f"new thread(s) of pid {first['pid']}, aligned "
        f"to {name!r} (pattern {report['kernelPattern']!r}); outer trace "
        f"{report['outerTrace']['sourceId']}: {report['outerTrace']['events']} events kept"
    )


DEMO_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}


def cmd_demo(args: argparse.Namespace) -> None:
    """Run the CPU reference MoE MegaKernel under both profilers; summarize its stages in SQL."""
    # torch only here: the other commands read and write stores and traces without it.
    import torch
    import torch.profiler

    from multicore_profiler.ingest.session import mega_kernel_profile
    from multicore_profiler.kernels.reference import ReferenceMoeKernel, make_moe_weights, route

    store = _store(args, create=True)
    generator = torch.Generator().manual_seed(args.seed)
    router, w1, w2 = make_moe_weights(8, 256, 512, generator=generator)
    # Beside a local store; in the working directory for a remote one.
    name = store.uri.rstrip("/").rsplit("/", 1)[-1]
    parent = store.root.parent if store.location.is_local else Path.cwd()
    torch_trace = parent / f"{name}-torch"
    torch_trace.mkdir(exist_ok=True)
    trace_path = torch_trace / "pending.pt.trace.json"
    with (
        ReferenceMoeKernel(w1, w2, tiles_per_expert=2, token_tile=64) as kernel,
        # The same schedule as the MegaKernel's: each torch trace covers one capture window.
        torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            schedule=torch.profiler.schedule(**DEMO_SCHEDULE),
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)),
        ) as outer,
        mega_kernel_profile(
            store=store,
            schedule=schedule(**DEMO_SCHEDULE),
            label="demo",
            tags={"kernel": "ReferenceMegaMoe", "tokens": "256"},
        ) as prof,
    ):
        for _ in tqdm(range(args.steps), desc="demo", unit="step", disable=None):
            for _ in range(args.launches):
                x = torch.randn(256, 256, generator=generator)
                kernel(x, *route(x, router, 2))
            prof.step()
            outer.step()
    window = prof.windows[-1].index
    trace_path = trace_path.rename(torch_trace / f"{prof.run_id}.window{window}.pt.trace.json")
    summary = store.sql(
        """SELECT stage, records,
                  round(compute_p50_us, 1) AS p50_compute_us,
                  round(compute_p99_us, 1) AS p99_compute_us,
                  round(wait_p50_us, 1) AS p50_wait_us,
                  round(wait_p99_us, 1) AS p99_wait_us,
                  dropped
           FROM stage_stats WHERE run_id = $1 ORDER BY stage_desc_id""",
        [prof.run_id],
    )
    totals = store.sql("SELECT * FROM run_summary WHERE run_id = $1", [prof.run_id]).to_pylist()
    print(
        f"run {prof.run_id} in {store.uri}: {totals[0]['invocations']} invocations in "
        f"{len(prof.windows)} window(s) of {schedule(**DEMO_SCHEDULE)}, "
        f"{totals[0]['records']} records, {totals[0]['dropped']} dropped"
    )
    _emit(summary, "table", None)
    print(f"torch.profiler trace of window {window}: {trace_path}")
    fused = torch_trace / f"{prof.run_id}.window{window}.fused.json"
    selection = {"store": store, "run": prof.run_id, "window": window}
    try:
        merge_chrome_traces(trace_path, store, fused, **selection)
    except FuseError as exc:
        # The CPU kernel has no device event: only host-side ops carry its name.
        print(f"fuse: refused without --allow-host-alignment: {exc}")
    merged = merge_chrome_traces(trace_path, store, fused, allow_host_alignment=True, **selection)
    for warning in merged.report["warnings"]:
        print(f"fuse: with --allow-host-alignment, warning: {warning}")
    print(
        f"fused trace of window {window}: {merged.path} ({merged.records} records, "
        f"{merged.added_events} events added)"
    )
    print(f'try: mcprof query --store {store.uri} "SELECT * FROM stage_stats"')
    print(f"     mcprof export --store {store.uri} -o {prof.run_id}.json  # for ui.perfetto.dev")
    print(
        f"     mcprof fuse {trace_path} --store {store.uri} --run {prof.run_id} "
        f"--window {window} --allow-host-alignment -o {prof.run_id}.fused.json"
    )


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--store",
        type=_store_location,
        default=default_store_path(),
        help="store directory or URI such as s3://bucket/prefix "
        "(default: $MCPROF_STORE or ./mcprof-store)",
    )
    output = _Parser(add_help=False)
    output.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: table)"
    )
    output.add_argument(
        "-o", "--output", type=_path, help="write to this file instead of standard output"
    )

    parser = _Parser(
        prog="mcprof",
        description="Intra-kernel profiles of MegaKernels, in a Parquet store queried with SQL.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.type = str  # the command's own parser reads its arguments, naming them

    runs = commands.add_parser("runs", parents=[common, output], help="list the runs in the store")
    runs.add_argument(
        "--select",
        metavar="SELECTOR",
        help="only these runs, e.g. branch:main,latest:5 or commit:3f2a,tag:model=moe-7b",
    )
    runs.set_defaults(func=cmd_runs)

    rules = _Parser(add_help=False)
    rules.add_argument(
        "--rules", type=_path, help="kernel rules (TOML): families, steps, layers, segments"
    )
    rules.add_argument(
        "--steps",
        metavar="REGEX",
        help="step annotation pattern, or 'profiler' (ProfilerStep#N, the default) or 'vllm'",
    )

    query = commands.add_parser(
        "query", parents=[common, output, rules], help="run SQL over the store's views"
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

    compare = commands.add_parser(
        "compare",
        parents=[common],
        help="what got slower (or faster) between two sets of runs, with statistics",
        description="Compare the records of the base runs with those of the head runs, per "
        "group: medians, p90, the median's relative change with a bootstrap interval, a "
        "Mann-Whitney U p-value and a verdict. Exit status: 1 with --fail-on-regression when "
        "a group regressed, 2 on a usage error, else 0.",
    )
    compare.add_argument("--base", required=True, metavar="SELECTOR", help="e.g. commit:3f2a")
    compare.add_argument("--head", required=True, metavar="SELECTOR", help="e.g. commit:9c1e")
    compare.add_argument(
        "--level",
        choices=sorted(LEVELS),
        default="records",
        help="records (default), invocations (wall time of each launch), or kernels (of the "
        "outer traces in the store; the selectors then choose traces)",
    )
    compare.add_argument(
        "--by",
        help="group columns (default: kernel_name,stage,phase for records, kernel_name for "
        "invocations, family for kernels)",
    )
    compare.add_argument(
        "--threshold",
        type=_in(THRESHOLD),
        default=0.05,
        help="relative change of the median (0.05)",
    )
    compare.add_argument("--alpha", type=_in(ALPHA), default=0.01, help="significance level (0.01)")
    compare.add_argument("--format", choices=("table", "json", "markdown", "csv"), default="table")
    compare.add_argument("-o", "--output", type=_path, help="write to this file")
    compare.add_argument(
        "--plot", type=_path, metavar="IMAGE", help="draw each group's durations (e.g. out.png)"
    )
    compare.add_argument(
        "--fail-on-regression", action="store_true", help="exit with status 1 if a group regressed"
    )
    compare.set_defaults(func=cmd_compare, error_status=2)

    report = commands.add_parser(
        "report",
        parents=[common],
        help="write a self-contained HTML report of runs (stages, a timeline, a comparison)",
    )
    report.add_argument("--run", required=True, metavar="SELECTOR", help="e.g. commit:9c1e")
    report.add_argument("--base", metavar="SELECTOR", help="compare the runs against these")
    report.add_argument(
        "--invocation",
        type=_in(INVOCATION_ID),
        help="the invocation to draw (default: the latest run's first)",
    )
    report.add_argument("-o", "--output", type=_path, required=True, help="the page (.html)")
    report.set_defaults(func=cmd_report)

    kernels = commands.add_parser(
        "kernels",
        parents=[common, output, rules],
        help="per-step kernel family times of torch.profiler / kineto or torch_npu traces",
        description="Load trace files into the store (or name traces already there by source "
        "id) and print, per step, its GPU period, busy share and each kernel family's union "
        "(wall) time in ms.",
    )
    kernels.add_argument("traces", nargs="+", metavar="TRACE_OR_SOURCE")
    kernels.add_argument("--rank", type=_in(RANK), help="rank of newly loaded traces")
    kernels.add_argument("--label", help="label of newly loaded traces")
    kernels.set_defaults(func=cmd_kernels)

    ingest = commands.add_parser(
        "ingest-buffer",
        parents=[common],
        help="decode raw profile buffers dumped from a device into the store",
    )
    ingest.add_argument(
        "files",
        nargs="+",
        type=_path,
        metavar="FILE",
        help="one buffer per file, one invocation each",
    )
    for name in ("aic-slots", "aiv-slots", "aic-capacity", "aiv-capacity"):
        ingest.add_argument(f"--{name}", type=_in(SLOTS), required=True)
    ingest.add_argument(
        "--freq-mhz", type=_in(FREQUENCY_MHZ), required=True, help="cycle counter frequency in MHz"
    )
    ingest.add_argument("--rank", type=_in(RANK), default=0)
    ingest.add_argument("--device", type=_in(DEVICE), default=0)
    ingest.add_argument("--step", type=_in(STEP), default=0)
    ingest.add_argument("--kernel", default="MegaKernel", help="kernel name (default: MegaKernel)")
    ingest.add_argument("--run", help="add to this run (created if new; default: a new run)")
    ingest.add_argument("--label", help="label of a new run")
    ingest.add_argument(
        "--invocation",
        type=_in(INVOCATION_ID),
        help="id of the first invocation (default: next free one)",
    )
    ingest.add_argument("--direction", default="forward")
    ingest.add_argument("--soc", help="SoC name, e.g. Ascend910B4")
    ingest.add_argument("--owner-label", default="Owner")
    ingest.add_argument(
        "--stage",
        action="append",
        default=[],
        type=_stage,
        metavar="DESC_ID=NAME",
        help="name a stage id (repeatable)",
    )
    ingest.set_defaults(func=cmd_ingest_buffer)

    check = commands.add_parser(
        "check",
        parents=[common],
        help="verify every file of the store: checksums, schemas, counts, leftovers",
        description="Read every file of the store (or of some runs) with its page checksums "
        "verified; compare its schema with its table's and each invocation's record count with "
        "its records; list orphan and leftover files. Print one line per problem, "
        "<file>: <check>: <reason>, and a summary on standard error. Exit status: 1 when a "
        "check failed, else 0. Nothing is changed.",
    )
    check.add_argument(
        "--run", action="append", default=[], help="check only this run (repeatable)"
    )
    check.set_defaults(func=cmd_check)

    compact = commands.add_parser("compact", parents=[common], help="merge the small files of runs")
    compact.add_argument(
        "--run", action="append", default=[], help="run to compact (repeatable; default: all)"
    )
    compact.add_argument(
        "--grace",
        type=_in(HOURS),
        default=GRACE.total_seconds() / 3600,
        metavar="HOURS",
        help="keep files hidden for good this long for queries still reading them "
        f"(default: {GRACE.total_seconds() / 3600:g})",
    )
    compact.set_defaults(func=cmd_compact)

    gc = commands.add_parser(
        "gc",
        parents=[common, output],
        help="remove whole runs by age or count (a dry run unless --apply)",
    )
    gc.add_argument("--keep-last", type=_in(COUNT), metavar="N", help="keep the N newest runs")
    gc.add_argument(
        "--older-than",
        type=_in(DAYS),
        metavar="DAYS",
        help="remove runs last updated DAYS ago or more",
    )
    gc.add_argument(
        "--label", action="append", default=[], help="only runs of this label (repeatable)"
    )
    gc.add_argument("--apply", action="store_true", help="remove them (default: only list them)")
    gc.set_defaults(func=cmd_gc)

    export = commands.add_parser(
        "export",
        parents=[common],
        help="write a Chrome Trace (Perfetto, chrome://tracing) of records in the store",
        description="Write the Chrome Trace of a run (default: the latest), narrowed to a step, "
        "invocation, rank, window or SQL condition, or of the rows of any query.",
    )
    export.add_argument(
        "-o", "--output", type=_path, required=True, help="trace file (.json, or .json.gz)"
    )
    export.add_argument(
        "--run", action="append", default=[], help="run id (repeatable; default: the latest run)"
    )
    export.add_argument("--step", type=_in(STEP))
    export.add_argument("--invocation", type=_in(INVOCATION_ID))
    export.add_argument("--rank", type=_in(RANK))
    export.add_argument("--window", type=_in(WINDOW), help="capture window index")
    export.add_argument(
        "--where", help="SQL condition over records_ns columns, e.g. \"stage = 'GMM1'\""
    )
    export.add_argument(
        "--sql", help="a query whose rows carry the record columns, e.g. SELECT * FROM records_ns"
    )
    export.add_argument(
        "--detailed", action="store_true", help="name events <owner><id>_<stage>_task<n>"
    )
    export.set_defaults(func=cmd_export)

    ingest_trace_cmd = commands.add_parser(
        "ingest-trace",
        parents=[common],
        help="load torch.profiler / kineto or torch_npu Chrome traces into the store",
        description="Stream Chrome traces (.json or .json.gz) into the store's trace_events and "
        "trace_sources; print each file's source id. A file already there is not loaded again.",
    )
    ingest_trace_cmd.add_argument("files", nargs="+", type=_path, metavar="FILE")
    ingest_trace_cmd.add_argument(
        "--rank", type=_in(RANK), help="the traces' rank (default: their distributedInfo.rank)"
    )
    ingest_trace_cmd.add_argument("--label", help="a label for the traces")
    ingest_trace_cmd.add_argument(
        "--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag (repeatable)"
    )
    ingest_trace_cmd.set_defaults(func=cmd_ingest_trace)

    fuse = commands.add_parser(
        "fuse",
        help="add a MegaKernel's AIC/AIV tracks to a torch.profiler or torch_npu trace",
        description="Align the MegaKernel invocations of a standalone trace (--trace) or of a "
        "run in the store (--run) to the outer trace's device kernels and write one fused trace.",
    )
    fuse.add_argument("torch_trace", type=_path, metavar="TORCH_TRACE")
    source = fuse.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=_path, help="a MegaKernel trace from mcprof export")
    source.add_argument("--run", help="a run in the store")
    fuse.add_argument("--step", type=_in(STEP), help="with --run: only this step")
    fuse.add_argument("--window", type=_in(WINDOW), help="with --run: only this capture window")
    fuse.add_argument(
        "--store",
        type=_store_location,
        help="store (with --run, default $MCPROF_STORE or ./mcprof-store; with --trace the "
        "outer trace goes to a temporary store unless this is given)",
    )
    fuse.add_argument(
        "-o", "--output", type=_path, required=True, help="fused trace (.json, or .json.gz)"
    )
    fuse.add_argument("--rank", type=_in(RANK), help="rank of the outer trace (default: its own)")
    fuse.add_argument(
        "--kernel-pattern", help="regex of the outer kernel's name (default: from the kernel's)"
    )
    fuse.add_argument(
        "--kernel-index", type=_in(COUNT), default=0, help="skip this many matching kernels first"
    )
    fuse.add_argument("--outer-pid", type=_in(PID), help="only align to kernels of this pid")
    fuse.add_argument(
        "--allow-host-alignment",
        action="store_true",
        help="align to host-side events (CPU ops) when no device kernel matches",
    )
    fuse.add_argument(
        "--rebase",
        action="store_true",
        help="shift every timestamp so the trace starts near 0 (exact in viewers that read "
        "ts as a double)",
    )
    fuse.set_defaults(func=cmd_fuse)

    demo = commands.add_parser(
        "demo", parents=[common], help="profile the CPU reference MegaKernel into the store"
    )
    demo.add_argument("--steps", type=_in(DEMO_STEPS), default=10, help="steps to run (default 10)")
    demo.add_argument(
        "--launches", type=_in(LAUNCHES), default=2, help="kernel launches per step (default 2)"
    )
    demo.add_argument("--seed", type=_in(SEED), default=0)
    demo.set_defaults(func=cmd_demo)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"mcprof: warning: {message}", file=sys.stderr)


LIBRARY_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    duckdb.Error,
    pa.ArrowException,
    ValueError,  # UnicodeError, json / orjson decode errors, numpy's conversions
)
"""What a library call raises on bad input or a bad environment (a missing file, a
read-only store or output, corrupt bytes, text that is not UTF-8) when it escaped its
conversion into a ``ProfileError`` at its source."""


def _failure(exc: Exception) -> str:
    """What failed, in words, for an exception that is not a ``ProfileError``."""
    if isinstance(exc, OSError) and exc.strerror:
        return os_reason(exc)
    if isinstance(exc, LIBRARY_ERRORS):
        return f"{type(exc).__name__}: {exc}"
    return (
        f"internal error: {type(exc).__name__}: {exc} (please report it; "
        "MCPROF_DEBUG=1 shows the traceback)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``mcprof`` command; return its exit status."""
    args = _parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("always", DroppedRecordsWarning)
        warnings.showwarning = _show_warning
        # The boundary: every error ends in one line, never a traceback. The library raises
        # ProfileError for what it checks; LIBRARY_ERRORS that escaped a conversion are
        # named with the command and, for an OSError, the file. Anything else is a bug of
        # ours: one line too, marked "internal error" so that it is reported rather than
        # taken for bad input. MCPROF_DEBUG=1 lets every error through with its traceback.
        try:
            return args.func(args) or 0
        except KeyboardInterrupt:
            return 130
        except Exception as exc:
            if os.environ.get("MCPROF_DEBUG"):
                raise
            message = (
                str(exc) if isinstance(exc, ProfileError) else f"{args.command}: {_failure(exc)}"
            )
    print(f"mcprof: error: {_one_line(message)}", file=sys.stderr)
    # compare keeps status 1 for "regressed": its errors are usage errors (2).
    return getattr(args, "error_status", 1)


if __name__ == "__main__":
    sys.exit(main())
