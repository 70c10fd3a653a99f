"""Outputs that would overwrite a store or an input: every command that writes a file
(``-o``, ``--plot``) refuses, before any work, a path inside a store (the one given or any
other, spelled with ``..`` or through a symlink) and a path that is one of its inputs; the
library's writers refuse a path inside a store in the same words. Each refusal is one
``mcprof: error: ...`` line and leaves the store's files and bytes as they were."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hostile import refused, snapshot
from test_hostile_cli import TRACE, place  # noqa: F401 (place: the module's store)

from multicore_profiler import cli
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.errors import ArgumentError, ExportError, FuseError
from multicore_profiler.export.handlers import chrome_trace_handler
from multicore_profiler.export.report import write_report
from multicore_profiler.export.trace_formats import export_trace
from multicore_profiler.fuse.merge import merge_chrome_traces
from multicore_profiler.storage.store import open_store

WRITERS = [
    (("query", "--format", "parquet", "-o", "{out}", "SELECT * FROM records"), "-o", 1),
    (("runs", "--format", "csv", "-o", "{out}"), "-o", 1),
    (("export", "-o", "{out}"), "-o", 1),
    (("report", "--run", "r1", "-o", "{out}"), "-o", 1),
    (("analyze", "--format", "json", "-o", "{out}"), "-o", 1),
    (("analyze", "--plot", "{out}"), "--plot", 1),
    (("compare", "--base", "r1", "--head", "r2", "--format", "csv", "-o", "{out}"), "-o", 2),
    (("compare", "--base", "r1", "--head", "r2", "--plot", "{out}"), "--plot", 2),
    (("fuse", str(TRACE), "--run", "r1", "-o", "{out}"), "-o", 1),
    (("kernels", str(TRACE), "--format", "csv", "-o", "{out}"), "-o", 1),
    (("gc", "--keep-last", "5", "--format", "csv", "-o", "{out}"), "-o", 1),
]
"""Each command that writes a file, with ``{out}`` where the file goes: its option and the
status of its errors (``compare``: 2)."""


def committed(store: Path, table: str) -> Path:
    """The first committed Parquet file of ``table`` in run r1."""
    return sorted((store / table / "run_id=r1").rglob("part-*.parquet"))[0]


def inside_message(option: str, out: Path, store: Path) -> str:
    return (
        f"cannot write {option} {out}: it is inside the store at {store.resolve()}, whose "
        "files change only through its commits; give a path outside it"
    )


@pytest.mark.parametrize(("argv", "option", "status"), WRITERS)
@pytest.mark.parametrize(
    "where",
    [
        "a committed records part",
        "a new file in a records partition",
        "a committed invocations part",
        "the store's marker",
        "spelled with ..",
        "through a symlink",
    ],
)
def test_an_output_inside_the_store_is_refused(capsys, place, argv, option, status, where):  # noqa: F811
    # query -o into a partition wrote a Parquet file of the store's own rows there: every
    # later query counted them twice. Over a committed part or the marker, every later
    # query failed. Now refused before the command runs.
    store = Path(place["store"])
    scratch = Path(place["tmp"])
    out = {
        "a committed records part": committed(store, "records"),
        "a new file in a records partition": store / "records/run_id=r1/step=0/part-rows.parquet",
        "a committed invocations part": committed(store, "invocations"),
        "the store's marker": store / "mcprof-store.json",
        "spelled with ..": scratch / ".." / store.name / "records" / "rows.csv",
        "through a symlink": scratch / "store-link" / "runs" / "rows.csv",
    }[where]
    link = scratch / "store-link"
    if not link.is_symlink():
        link.symlink_to(store, target_is_directory=True)
    filled = [arg.format(out=out) for arg in argv]
    message = refused(capsys, *filled, "--store", str(store), status=status, store=store)
    assert message == inside_message(option, out, store)
    count = ("query", "--store", str(store), "--format", "csv", "SELECT count(*) FROM records")
    assert cli.main(list(count)) == 0
    assert capsys.readouterr().out == "count_star()\n8\n", "each run's 4 records, once"


def test_an_output_inside_another_store_is_refused(capsys, place, tmp_path):  # noqa: F811
    # Not only the store given: any directory a store's marker names is one.
    other = tmp_path / "other"
    shutil.copytree(place["store"], other)
    out = committed(other, "records")
    before = snapshot(other)
    argv = ("query", "--format", "parquet", "-o", str(out), "SELECT * FROM records")
    message = refused(capsys, *argv, "--store", place["store"], store=Path(place["store"]))
    assert message == inside_message("-o", out, other)
    assert snapshot(other) == before


@pytest.mark.parametrize("spelling", ["as given", "with ..", "through a symlink"])
def test_an_output_that_is_an_input_is_refused(capsys, place, tmp_path, spelling):  # noqa: F811
    # fuse -o its own outer trace replaced the trace it reads; query -o its --rules file
    # replaced the rules.
    outer = tmp_path / "outer.json.gz"
    shutil.copy(TRACE, outer)
    rules = tmp_path / "rules.toml"
    rules.write_text("")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.json.gz").symlink_to(outer)

    def spelled(path: Path) -> Path:
        if spelling == "with ..":
            return tmp_path / "sub" / ".." / path.name
        if spelling == "through a symlink" and path == outer:
            return tmp_path / "link.json.gz"
        return path

    store = Path(place["store"])
    cases = [
        (("fuse", str(outer), "--run", "r1", "-o", str(spelled(outer))), outer),
        (("fuse", str(TRACE), "--trace", str(outer), "-o", str(spelled(outer))), outer),
        (
            (
                "query",
                "--rules",
                str(rules),
                "--format",
                "csv",
                "-o",
                str(spelled(rules)),
                "SELECT 1",
            ),
            rules,
        ),
    ]
    for argv, given in cases:
        before = given.read_bytes()
        message = refused(capsys, *argv, "--store", str(store), store=store)
        assert message == (
            f"cannot write -o {spelled(given)}: it is the command's input {given}; "
            "give another path"
        )
        assert given.read_bytes() == before


def test_the_library_writers_refuse_a_path_inside_a_store(place, tmp_path):  # noqa: F811
    store_dir = tmp_path / "store"
    shutil.copytree(place["store"], store_dir)
    before = snapshot(store_dir)
    out = committed(store_dir, "records")
    why = (
        f"it is inside the store at {store_dir.resolve()}, whose files change only through "
        "its commits; give a path outside it"
    )
    with open_store(store_dir) as store:
        with pytest.raises(ExportError) as refusal:
            export_trace(store, out, RecordSelection(run="r1"))
        assert str(refusal.value) == f"cannot write the trace to {out}: {why}"
        with pytest.raises(ExportError) as refusal:
            write_report(store, "r1", store_dir / "report.html")
        assert (
            str(refusal.value) == f"cannot write the report to {store_dir / 'report.html'}: {why}"
        )
        with pytest.raises(FuseError) as refusal:
            merge_chrome_traces(TRACE, store, out, run="r1")
        assert str(refusal.value) == f"cannot write the fused trace to {out}: {why}"
        outer = tmp_path / "outer.json.gz"
        shutil.copy(TRACE, outer)
        with pytest.raises(FuseError) as refusal:
            merge_chrome_traces(outer, store, outer, run="r1")
        assert str(refusal.value) == (
            f"cannot write the fused trace to {outer}: it is the command's input {outer}; "
            "give another path"
        )
        with pytest.raises(ArgumentError) as refusal:
            chrome_trace_handler(store_dir / "traces", worker_name="w")
        assert str(refusal.value) == f"cannot write traces to {store_dir / 'traces'}: {why}"
    assert snapshot(store_dir) == before
    assert not (store_dir / "traces").exists()
