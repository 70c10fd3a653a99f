"""``mcprof``: the command line over a store.

Every command takes ``--store PATH`` (default ``$MCPROF_STORE`` or ``./mcprof-store``).
Errors print one line, ``mcprof: error: ...``, and exit with status 1; a usage error (an
unknown option, a missing argument, a value that is not a number or out of its range)
exits with status 2 (``compare``'s errors all exit with 2). A reader that closes the pipe
early (``mcprof query ... | head``) ends the command quietly with status 141, as a shell
reports for a Unix tool that SIGPIPE ended. Before a command runs, a file it would write
(``-o``, ``--plot``) inside a store or that is one of its inputs is refused
(``output.check_outputs``).

Each command (or group of commands) is a module here that adds its parser
(``register``) and calls the library; this module assembles them and runs one.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence

import duckdb
import pyarrow as pa

from multicore_profiler.cli import (
    analyze,
    compare,
    demo,
    export,
    fuse,
    imports,
    ingest,
    maintenance,
    outer_kernels,
    ranks,
    runs,
)
from multicore_profiler.cli.arguments import Parser, parents
from multicore_profiler.cli.output import check_outputs, one_line, warn
from multicore_profiler.errors import DroppedRecordsWarning, ProfileError
from multicore_profiler.storage.location import os_reason

PIPE_CLOSED = 128 + 13
"""The exit status when standard output's reader went away: 128 + SIGPIPE, what a shell
reports for ``seq 1000000 | head -1``'s ``seq``; distinct from an error's 1."""

COMMANDS = (
    runs,
    compare,
    analyze,
    ranks,
    outer_kernels,
    ingest,
    imports,
    maintenance,
    export,
    fuse,
    demo,
)
"""The command modules, in the order ``mcprof --help`` lists their commands."""


def _parser() -> argparse.ArgumentParser:
    """The parser of every command, made for each run (defaults read the environment)."""
    parser = Parser(
        prog="mcprof",
        description="Intra-kernel profiles of MegaKernels, in a Parquet store queried with SQL.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.type = str  # the command's own parser reads its arguments, naming them
    shared = parents()
    for command in COMMANDS:
        command.register(commands, shared)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    warn([message])


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


def _stdout_to_devnull() -> None:
    """Point standard output at the null device, so that the interpreter's flush at exit
    finds no closed pipe and prints nothing (as the Python docs' note on SIGPIPE does)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (a test's capture): nothing flushes at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


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
            check_outputs(args)
            status = args.func(args) or 0
            sys.stdout.flush()  # a reader gone is seen here, not as an error at exit
            return status
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            _stdout_to_devnull()
            return PIPE_CLOSED
        except Exception as exc:
            if os.environ.get("MCPROF_DEBUG"):
                raise
            message = (
                str(exc) if isinstance(exc, ProfileError) else f"{args.command}: {_failure(exc)}"
            )
    print(f"mcprof: error: {one_line(message)}", file=sys.stderr)
    # compare keeps status 1 for "regressed": its errors are usage errors (2).
    return getattr(args, "error_status", 1)
