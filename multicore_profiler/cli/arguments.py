"""What the commands' parsers share: the parser class, argument types, the store, output and
rules options, and the record-selection options of ``export`` and ``fuse``."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from multicore_profiler.cli.output import one_line
from multicore_profiler.errors import ArgumentError, ProfileError
from multicore_profiler.limits import DESC_ID, INT64, INVOCATION_ID, RANK, STEP, WINDOW, Range
from multicore_profiler.storage.default_store import default_store_path

if TYPE_CHECKING:
    from multicore_profiler.analysis.outer_kernel_rules import OuterKernelRules
    from multicore_profiler.export.timeline import RecordSelection
    from multicore_profiler.storage.store import Store

FORMATS = ("table", "csv", "json", "parquet")
"""What ``--format`` takes where rows are printed or written (``output.emit``)."""


def text(value: str) -> str:
    """The ``type`` of every argument that names none: the text as given, if it is text.
    An argument that is not valid UTF-8 reaches Python with lone surrogates, which no SQL,
    selector, name or label can hold (file paths, ``path``, may)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not valid UTF-8 text (at character {exc.start})"
        ) from None
    return value


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, ``mcprof: error: ...`` (exit 2),
    like every other error: not the usage block and the subcommand's name; an argument
    without a ``type`` is read by ``text``. Subparsers are made of the same class
    (``add_subparsers`` takes the parser's own)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("type", None, text)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"mcprof: error: {one_line(message)}\n")


def in_range(limits: Range) -> Callable[[str], int | float]:
    """An argparse ``type`` reading a number of ``limits``: a value outside it is a usage
    error naming the option, the value and the range."""

    def parse(value: str) -> int | float:
        try:
            return limits.parse(value)
        except ArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def named_id(what: str, form: str) -> Callable[[str], tuple[int, str]]:
    """An argparse ``type`` reading ``ID=NAME`` (the id a 32-bit number, decimal or
    ``0x...``); ``what`` and ``form`` word its refusal (``a stage is DESC_ID=NAME ...``)."""

    def parse(value: str) -> tuple[int, str]:
        number, sep, name = value.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"{what} is {form}, got {value!r}")
        return int(in_range(DESC_ID)(number)), text(name)

    return parse


def id_names(pairs: Sequence[tuple[int, str]], option: str, kind: str) -> dict[int, str]:
    """The ``option`` names (``named_id`` pairs) by id; an id named twice, differently, is
    refused."""
    names: dict[int, str] = {}
    for number, name in pairs:
        if names.setdefault(number, name) != name:
            raise ArgumentError(
                f"{option} names {kind} {number:#x} twice: {names[number]!r} and {name!r}"
            )
    return names


def key_values(pairs: Sequence[str], option: str) -> dict[str, str]:
    """The ``option KEY=VALUE`` pairs as a mapping (a later key wins)."""
    values = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ProfileError(f"{option} {pair!r} is not KEY=VALUE")
        values[key] = value
    return values


def location(value: str) -> str:
    """An argparse ``type`` for a store or file location: not empty (which would mean the
    working directory) and without NUL bytes (which no file name holds)."""
    if not value.strip() or "\0" in value:
        raise argparse.ArgumentTypeError(f"{value!r} is not a path or URI")
    return value


def store_location(value: str) -> str:
    """An argparse ``type`` for ``--store``: a location (``location``) that is text, as
    DuckDB reads the store's files by their names."""
    return text(location(value))


def path(value: str) -> Path:
    """An argparse ``type`` for a file argument, checked as ``location``."""
    return Path(location(value))


@dataclass(frozen=True)
class Parents:
    """The option groups several commands take, as parent parsers: ``--store``; ``--format``
    and ``-o``; the outer-kernel rules (``--rules``, ``--steps``)."""

    store: argparse.ArgumentParser
    output: argparse.ArgumentParser
    rules: argparse.ArgumentParser


def parents() -> Parents:
    """The shared option groups, made for each parse: ``--store``'s default reads
    ``$MCPROF_STORE`` then."""
    store = Parser(add_help=False)
    store.add_argument(
        "--store",
        type=store_location,
        default=default_store_path(),
        help="store directory or URI such as s3://bucket/prefix "
        "(default: $MCPROF_STORE or ./mcprof-store)",
    )
    output = Parser(add_help=False)
    output.add_argument(
        "--format", choices=FORMATS, default="table", help="output format (default: table)"
    )
    output.add_argument(
        "-o", "--output", type=path, help="write to this file instead of standard output"
    )
    rules = Parser(add_help=False)
    rules.add_argument(
        "--rules", type=path, help="kernel rules (TOML): families, steps, layers, segments"
    )
    rules.add_argument(
        "--steps",
        metavar="REGEX",
        help="step annotation pattern, or 'profiler' (ProfilerStep#N, the default) or 'vllm'",
    )
    return Parents(store=store, output=output, rules=rules)


def open_given_store(args: argparse.Namespace, *, create: bool = False) -> Store:
    """The store ``--store`` names; with ``create``, a new empty one where there is none."""
    from multicore_profiler.storage.store import open_store

    return open_store(args.store, create=create)


def outer_kernel_rules(args: argparse.Namespace) -> OuterKernelRules:
    """The outer-kernel rules of ``--rules`` (default: the built-in ones), with the step
    pattern of ``--steps`` if given."""
    from multicore_profiler.analysis.outer_kernel_rules import OuterKernelRules

    rules = OuterKernelRules() if args.rules is None else OuterKernelRules.load(args.rules)
    return rules if args.steps is None else dataclasses.replace(rules, steps=args.steps)


RECORD_SELECTION = ("run", "step", "invocation", "rank", "window", "where", "sql")
"""The options that select records of the store: the fields of ``RecordSelection``
(``--sql`` is its ``query``)."""

_NARROWING: dict[str, tuple[Range | None, str]] = {
    "step": (STEP, "only this step"),
    "invocation": (INVOCATION_ID, "only this invocation"),
    "rank": (RANK, "only this rank"),
    "window": (WINDOW, "only this capture window"),
    "where": (None, "SQL condition over records_ns columns, e.g. \"stage = 'GMM1'\""),
    "sql": (None, "a query whose rows carry the record columns, e.g. SELECT * FROM records_ns"),
}
"""Each option narrowing the records of a run: the range of its number (None: text), its help."""


def add_record_selection(
    parser: argparse.ArgumentParser,
    names: Sequence[str] = RECORD_SELECTION,
    *,
    one_run_among: argparse._MutuallyExclusiveGroup | None = None,
    scope: str = "",
) -> None:
    """Add the record-selection options ``names`` (of ``RECORD_SELECTION``) to ``parser``.

    ``--run`` is repeatable (default: the latest run) or, added to ``one_run_among`` (a
    group of its alternatives), names one run. ``scope`` begins the help of the options
    that narrow the run (``"with --run: "``)."""
    for name in names:
        if name != "run":
            limits, description = _NARROWING[name]
            parser.add_argument(
                f"--{name}",
                type=None if limits is None else in_range(limits),
                help=scope + description,
            )
        elif one_run_among is None:
            parser.add_argument(
                "--run",
                action="append",
                default=[],
                help="run id (repeatable; default: the latest run)",
            )
        else:
            one_run_among.add_argument("--run", help="a run in the store")


def add_clock_correction(parser: argparse.ArgumentParser, scope: str = "") -> None:
    """Add ``--clock-correction``: the selected runs' per-core clock offsets estimated from
    their records' causality and applied before the command's work (docs/clocks.md)."""
    parser.add_argument(
        "--clock-correction",
        action="store_true",
        help=scope + "correct each core's clock by the offset its records' causality asks for "
        "(a wait cannot end before the trigger that released it) before the work, and say "
        "which offsets were applied (see docs/clocks.md)",
    )


CLOCK_TOLERANCE = Range("a clock tolerance in ns", 0, INT64.high)
"""``--clock-tolerance``: how far a record may contradict causality, in whole ns."""


def add_clock_tolerance(parser: argparse.ArgumentParser, consequence: str) -> None:
    """Add ``--clock-tolerance NS`` (the store setting ``clock_tolerance`` for this command);
    ``consequence`` says what a contradiction beyond it does in this command."""
    parser.add_argument(
        "--clock-tolerance",
        type=in_range(CLOCK_TOLERANCE),
        metavar="NS",
        help="how far (ns) a wait may end before the trigger that released it ended before "
        f"the cores' clocks count as contradicted, {consequence} (default 0)",
    )


def configure_clock_tolerance(store: Store, args: argparse.Namespace) -> None:
    """Take ``--clock-tolerance`` into ``store``, where it was given."""
    if args.clock_tolerance is not None:
        store.configure("clock_tolerance", args.clock_tolerance)


def selection_arguments(
    args: argparse.Namespace, names: Sequence[str] = RECORD_SELECTION
) -> dict[str, Any]:
    """The record-selection options ``names`` of ``args`` as keyword arguments, named as
    ``RecordSelection`` and ``merge_chrome_traces`` name them: no ``--run`` is None (the
    latest run), ``--sql`` is ``query``."""
    given = {name: getattr(args, name) for name in names}
    if given.get("run") == []:
        given["run"] = None
    if "sql" in given:
        given["query"] = given.pop("sql")
    return given


def record_selection(args: argparse.Namespace) -> RecordSelection:
    """The records every record-selection option of ``args`` selects."""
    from multicore_profiler.export.timeline import RecordSelection

    return RecordSelection(**selection_arguments(args))
