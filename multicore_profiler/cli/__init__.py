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
(``register``) and calls the library; this module assembles them and runs one. A command
module imports the library inside its command functions, never at its top, so building
the parser imports none of it: a command pays for the imports it uses, and ``mcprof
--help`` for none (``tests/test_cli_imports.py``).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import warnings
from collections.abc import Sequence
from importlib import import_module

from multicore_profiler.cli.arguments import Parser, parents
from multicore_profiler.cli.output import check_outputs, one_line, warn
from multicore_profiler.errors import DroppedRecordsWarning, ProfileError
from multicore_profiler.no_pandas import keep_pandas_out

PIPE_CLOSED = 128 + 13
"""The exit status when standard output's reader went away: 128 + SIGPIPE, what a shell
reports for ``seq 1000000 | head -1``'s ``seq``; distinct from an error's 1."""

COMMANDS: dict[str, tuple[str, str]] = {
    "runs": ("runs", "list the runs in the store"),
    "query": ("runs", "run SQL over the store's views"),
    "compare": ("compare", "what got slower (or faster) between two sets of runs, with statistics"),
    "report": (
        "compare",
        "write a self-contained HTML report of runs (stages, per-core breakdown, a timeline "
        "with its critical path, speed-up curves, a comparison)",
    ),
    "analyze": (
        "analyze",
        "where the kernel's time goes: critical path, blockers, imbalance, what-if",
    ),
    "ranks": ("ranks", "across ranks: the slowest rank per step, why, and communication waits"),
    "kernels": (
        "outer_kernels",
        "per-step kernel family times of torch.profiler / kineto or torch_npu traces",
    ),
    "ingest-buffer": ("ingest", "decode raw profile buffers dumped from a device into the store"),
    "ingest-trace": (
        "ingest",
        "load torch.profiler / kineto or torch_npu traces (files or output folders) into the "
        "store, as the ranks of one job",
    ),
    "import": (
        "imports",
        "import other profilers' intra-kernel records (Proton, FlashInfer, MPK, ...)",
    ),
    "check": (
        "maintenance",
        "verify every file of the store: checksums, schemas, counts, leftovers",
    ),
    "compact": ("maintenance", "merge the small files of runs"),
    "gc": ("maintenance", "remove whole runs by age or count (a dry run unless --apply)"),
    "export": (
        "export",
        "write the trace (Chrome JSON or Perfetto protobuf) of records in the store",
    ),
    "trace-buffer": (
        "trace_buffer",
        "decode raw profile buffers and write their trace, with no store (ingest-buffer, then "
        "export, through a temporary store)",
    ),
    "fuse": ("fuse", "add a MegaKernel's AIC/AIV tracks to a torch.profiler or torch_npu trace"),
    "demo": ("demo", "profile the CPU reference MegaKernel into the store"),
}
"""Each command's module (under ``multicore_profiler.cli``) and its line in ``mcprof
--help``, in the order listed there. A module's ``register`` adds its commands' parsers."""


def _parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of the command ``argv`` names, made for each run (defaults read the
    environment). Only that command's module is imported and its parser built; every
    other command is a bare entry with its help, enough to list it and to name it among
    the choices, so ``mcprof --help`` imports no command module at all."""
    parser = Parser(
        prog="mcprof",
        description="Intra-kernel profiles of MegaKernels, in a Parquet store queried with SQL.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.type = str  # the command's own parser reads its arguments, naming them
    named = next((arg for arg in argv if not arg.startswith("-")), None)
    module = COMMANDS[named][0] if named in COMMANDS else None
    if module is not None:
        import_module(f"{__name__}.{module}").register(commands, parents())
    for command, (of_module, line) in COMMANDS.items():
        if of_module != module:
            commands.add_parser(command, help=line)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    warn([message])


def library_errors() -> tuple[type[Exception], ...]:
    """What a library call raises on bad input or a bad environment (a missing file, a
    read-only store or output, corrupt bytes, text that is not UTF-8) when it escaped its
    conversion into a ``ProfileError`` at its source. DuckDB's and Arrow's errors are
    named only where the command imported them: an error of a library not imported cannot
    have been raised."""
    errors: list[type[Exception]] = [
        OSError,
        ValueError,  # UnicodeError, json / orjson decode errors, numpy's conversions
    ]
    if "duckdb" in sys.modules:
        errors.append(sys.modules["duckdb"].Error)
    if "pyarrow" in sys.modules:
        errors.append(sys.modules["pyarrow"].ArrowException)
    return tuple(errors)


def _failure(exc: Exception) -> str:
    """What failed, in words, for an exception that is not a ``ProfileError``."""
    if isinstance(exc, OSError) and exc.strerror:
        from multicore_profiler.storage.location import os_reason

        return os_reason(exc)
    if isinstance(exc, library_errors()):
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


def command() -> int:
    """The ``mcprof`` program: ``main`` in a process of its own, which runs without pandas
    (``no_pandas``); return its exit status. The process ends next, so everything is then
    frozen out of the garbage collector (``gc.freeze``): the interpreter's last collection
    would walk every object the libraries made, about 30 ms of each command. Exit handlers
    still run (temporary directories still go)."""
    keep_pandas_out()
    try:
        return main()
    finally:
        gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``mcprof`` command; return its exit status. The process is left as it is:
    a program or test may call it beside its own code."""
    given = sys.argv[1:] if argv is None else list(argv)
    args = _parser(given).parse_args(given)
    with warnings.catch_warnings():
        warnings.simplefilter("always", DroppedRecordsWarning)
        warnings.showwarning = _show_warning
        # The boundary: every error ends in one line, never a traceback. The library raises
        # ProfileError for what it checks; library_errors() that escaped a conversion are
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
