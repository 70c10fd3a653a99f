"""How the commands print: one-line messages and warnings, and rows as a table, CSV, JSON
or Parquet; and the check of the files a command writes (``check_outputs``)."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multicore_profiler.errors import ArgumentError, ProfileError
from multicore_profiler.scratch import ScratchDirectory

if TYPE_CHECKING:
    import pyarrow as pa

    from multicore_profiler.storage.store import Store

OUTPUTS = {"output": "-o", "plot": "--plot"}
"""The arguments naming a file a command writes, by their option."""


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before the command runs, an output (``OUTPUTS``) inside a store (any store,
    not only ``--store``) or that is one of the command's input files (its other path
    arguments: the outer trace, ``--trace``, ``--rules``, ...): ``ArgumentError`` naming
    the option, the path and why."""
    given = vars(args)
    inputs = [
        value
        for name, values in given.items()
        if name not in OUTPUTS
        for value in (values if isinstance(values, list) else [values])
        if isinstance(value, Path)
    ]
    for name, option in OUTPUTS.items():
        output = given.get(name)
        if not isinstance(output, Path):
            continue
        from multicore_profiler.export.files import check_output

        try:
            check_output(output, inputs)
        except ValueError as exc:
            raise ArgumentError(f"cannot write {option} {output}: {exc}") from None


def one_line(message: str) -> str:
    """A message as one line: its non-empty lines joined by ``; ``."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def warn(warnings: Iterable[object]) -> None:
    """Print each warning on standard error as ``mcprof: warning: ...``."""
    for warning in warnings:
        print(f"mcprof: warning: {warning}", file=sys.stderr)


def say_clock_correction(correction: dict[str, Any], where: str) -> None:
    """Print what a clock correction (a ``clockCorrection`` object) moved, and ``where``
    the output holds its offsets."""
    cores = correction["cores"]
    invocations = {(c["runId"], c["rank"], c["invocationId"]) for c in cores}
    print(
        f"clock correction applied: {len(cores)} core(s) of {len(invocations)} invocation(s) "
        f"moved; the offsets are in {where}"
    )


def write_rendered(rendered: str | bytes, output: Path | None) -> None:
    """Print a rendered report (text or bytes) to standard output, or write it to
    ``output``."""
    data = rendered.encode() if isinstance(rendered, str) else rendered
    if output is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        output.write_bytes(data)


def emit(table: pa.Table, fmt: str, output: Path | None, store: Store | None = None) -> None:
    """Print or write query rows: a box table, CSV, a JSON array, or Parquet (to a file);
    with the ``store`` the rows came from, through its database (``Store.cursor``)."""
    if fmt == "table" and output is not None:
        raise ProfileError(
            "--format table prints to the terminal; pick csv, json or parquet for -o"
        )
    if fmt == "parquet" and output is None:
        raise ProfileError("--format parquet writes a binary file: give one with -o FILE")
    import duckdb

    from multicore_profiler.storage.connection import arrow_cursor

    with arrow_cursor() if store is None else store.cursor() as con:
        con.execute("SET TimeZone = 'UTC'")
        con.register("result", table)
        if fmt == "table":
            width = shutil.get_terminal_size((160, 40)).columns
            con.sql("SELECT * FROM result").show(max_width=width, max_rows=max(table.num_rows, 1))
            return
        options = {
            "csv": "FORMAT csv, HEADER",
            "json": "FORMAT json, ARRAY true",
            "parquet": "FORMAT parquet",
        }
        with ScratchDirectory("mcprof-") as scratch:
            target = output if output is not None else scratch / f"result.{fmt}"
            try:
                con.execute(
                    f"COPY (SELECT * FROM result) TO $target ({options[fmt]})",
                    {"target": str(target)},
                )
            except duckdb.Error as exc:
                raise ProfileError(f"cannot write {target}: {exc}") from exc
            if output is None:
                sys.stdout.flush()
                with open(target, "rb") as rows:
                    shutil.copyfileobj(rows, sys.stdout.buffer)
                sys.stdout.buffer.flush()
