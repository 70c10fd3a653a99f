"""Hostile inputs to ``export`` and ``report``: SQL that would write, SQL DuckDB cannot run,
NULL or unconvertible record values, outputs that cannot be written, names that are
markup. Each ends in one typed error (one ``mcprof: error:`` line, exit 1), with the store
unchanged and no output file; or in an exact result."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from golden import AIC, AIV, GMM1, TRIGGER, WAIT, Slot, pack
from hostile import refused, snapshot
from simulated_runs import write_run
from test_export import NAMED, RUN, fill, golden_buffer, golden_tasks
from test_report import rendered
from trace_checker import check_trace, load_trace

from multicore_profiler.errors import ArgumentError, ExportError, QueryError, StatementError
from multicore_profiler.export import chrome_trace
from multicore_profiler.export.chrome_trace import ExportQueryError, export_chrome_trace
from multicore_profiler.export.report import script_json, write_report
from multicore_profiler.kernels.synthetic import SimulatedMoeKernel
from multicore_profiler.storage.store import Store


@pytest.fixture
def golden(store: Store) -> Store:
    fill(store, NAMED, [golden_buffer()])
    store.write_tasks(RUN, golden_tasks())
    return store


def only_store(tmp_path: Path, store: Store) -> None:
    """Nothing but the store in ``tmp_path``: no trace, no hidden temporary file."""
    assert list(tmp_path.iterdir()) == [store.root]


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("true); COPY (SELECT 1) TO '{target}' (FORMAT csv", "';'|closes a parenthesis"),
        ("true; COPY (SELECT 1) TO '{target}'", "';'"),
        ("true) OR (true", "closes a parenthesis"),
        ("true --", "comment"),
        (" ", "empty"),
    ],
)
def test_where_must_be_one_expression(
    golden: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, words: str
) -> None:
    target = tmp_path / "copied.csv"
    where = where.format(target=target)
    before = snapshot(golden.root)
    with pytest.raises(StatementError, match=words):
        export_chrome_trace(golden, tmp_path / "t.json", where=where)
    message = refused(
        capsys, "export", "--store", str(golden.root), "-o", str(tmp_path / "t.json"),
        "--where", where, store=golden.root,
    )  # fmt: skip
    assert message.startswith("the --where condition")
    assert re.search(words, message)
    assert snapshot(golden.root) == before
    only_store(tmp_path, golden)


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("COPY (SELECT * FROM records) TO '{target}' (FORMAT csv)", "type COPY"),
        ("SELECT * FROM records; COPY (SELECT 1) TO '{target}'", "holds 2 statements"),
        ("ATTACH '{target}' AS other", "type ATTACH"),
        ("CREATE TABLE {name} AS SELECT * FROM records", "type CREATE"),
        ("SET threads = 1", "type SET"),
    ],
)
def test_sql_must_be_one_read_only_statement(
    golden: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str, words: str
) -> None:
    query = query.format(target=tmp_path / "copied.db", name="copied")
    with pytest.raises(StatementError, match=words):
        export_chrome_trace(golden, tmp_path / "t.json", query=query)
    message = refused(
        capsys, "export", "--store", str(golden.root), "-o", str(tmp_path / "t.json"),
        "--sql", query, store=golden.root,
    )  # fmt: skip
    assert message.startswith("the --sql query")
    assert words in message
    only_store(tmp_path, golden)


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("SELECT * FROM no_such_table", "Catalog Error: Table with name no_such_table"),
        ("SELECT * REPLACE ('x' AS owner_id) FROM records", "Conversion Error"),
        ("SELECT * REPLACE (-1 AS desc_id) FROM records", "Conversion Error"),
        ("SELECT * FROM records WHERE no_such_column = 1", "Binder Error"),
        # 2^64 - 1 cycles from the anchor at 50 MHz: no 64-bit count of ns holds it.
        ("SELECT * REPLACE (18446744073709551615::UBIGINT AS end_cycle) FROM records", "Conv"),
    ],
)
def test_duckdb_errors_name_the_export_in_one_line(
    golden: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str], query: str, words: str
) -> None:
    with pytest.raises(ExportQueryError) as raised:
        export_chrome_trace(golden, tmp_path / "t.json", query=query)
    message = str(raised.value)
    assert message.startswith(f"cannot export query {query!r}: {words}")
    assert "\n" not in message
    assert isinstance(raised.value, ExportError)
    assert isinstance(raised.value, QueryError)
    cli = refused(
        capsys, "export", "--store", str(golden.root), "-o", str(tmp_path / "t.json"),
        "--sql", query, store=golden.root,
    )  # fmt: skip
    assert cli == message
    only_store(tmp_path, golden)


def test_null_record_values_are_refused(golden: Store, tmp_path: Path) -> None:
    query = "SELECT * REPLACE (NULL AS owner_id, NULL AS task_id) FROM records"
    with pytest.raises(
        ExportError, match=r"NULL in the record column\(s\) task_id \(6\), owner_id"
    ):
        export_chrome_trace(golden, tmp_path / "t.json", query=query)
    only_store(tmp_path, golden)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"rank": 2**31}, "--rank"),
        ({"step": -1}, "--step"),
        ({"invocation": 2**63}, "--invocation"),
        ({"window": 2**64}, "--window"),
    ],
)
def test_numbers_out_of_range_are_refused(
    golden: Store, tmp_path: Path, options: dict[str, Any], words: str
) -> None:
    with pytest.raises(ArgumentError, match=words):
        export_chrome_trace(golden, tmp_path / "t.json", **options)
    only_store(tmp_path, golden)


@pytest.mark.parametrize(
    ("output", "words"),
    [
        ("missing/t.json", "the directory .*missing does not exist"),
        (".", "it is a directory"),
        ("/dev/null", "not a regular file"),
        ("/sys/t.json", "Permission denied|Read-only file system"),
    ],
)
def test_outputs_that_cannot_be_written_are_refused_first(
    golden: Store,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    output: str,
    words: str,
) -> None:
    """Refused before the query runs (a query that would fail says nothing), leaving no file."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ExportError, match=f"cannot write the trace to {output}: .*({words})"):
        export_chrome_trace(golden, output, query="SELECT * FROM no_such_table")
    refused(capsys, "export", "--store", str(golden.root), "-o", output, store=golden.root)
    with pytest.raises(ExportError, match=f"cannot write the report to {output}: .*({words})"):
        write_report(golden, "latest:1", output)
    only_store(tmp_path, golden)
    assert Path("/dev/null").is_char_device()


def overlapping_buffer() -> bytearray:
    """The golden kernel with task 9's compute overlapping task 7's on AIC/0, and task 7's
    trigger, which releases task 8's wait on AIV/1, on the sub-track that makes."""
    return pack(
        1,
        2,
        16,
        16,
        [
            Slot(
                AIC,
                0,
                100,
                [
                    (110, 160, WAIT, 7, 2, 5),
                    (160, 400, GMM1, 7, 2, 5),
                    (300, 450, GMM1, 9, 0, 5),
                    (390, 420, TRIGGER, 7, 2, 5),
                ],
            ),
            Slot(AIV, 1, 120, [(130, 430, WAIT, 8, 0, 5), (430, 500, 0x20000 + 102, 8, 0, 5)]),
        ],
    )


def test_streaming_in_groups_writes_the_same_bytes(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One track a group (arrows between groups, sub-tracks found in a first pass) writes
    the trace that one group of everything writes, plain and gzipped."""
    fill(store, NAMED, [golden_buffer()])
    store.write_tasks(RUN, golden_tasks())
    fill(store, NAMED, [overlapping_buffer()], run_id="overlap")
    store.write_tasks("overlap", golden_tasks())
    write_run(store, SimulatedMoeKernel(experts=2, tiles=2), seed=1, commit="abcd")
    selections: list[dict[str, Any]] = [
        {"run": "overlap"},
        {"run": [RUN, "overlap", "run-abcd-1"], "detailed_task_names": True},
        {"query": "SELECT * FROM records_ns WHERE phase <> 'compute'"},
    ]
    for number, options in enumerate(selections):
        whole = export_chrome_trace(store, tmp_path / f"whole{number}.json", **options)
        with monkeypatch.context() as patch:
            patch.setattr(chrome_trace, "GROUP_ROWS", 1)
            parts = export_chrome_trace(store, tmp_path / f"parts{number}.json", **options)
            zipped = export_chrome_trace(store, tmp_path / f"parts{number}.json.gz", **options)
        expected = (tmp_path / f"whole{number}.json").read_bytes()
        assert (tmp_path / f"parts{number}.json").read_bytes() == expected
        assert load_trace(tmp_path / f"parts{number}.json.gz") == load_trace(
            tmp_path / f"whole{number}.json"
        )
        assert (parts.events, parts.records, parts.flows) == (
            whole.events,
            whole.records,
            whole.flows,
        )
        assert zipped.metadata == whole.metadata
        check_trace(load_trace(tmp_path / f"whole{number}.json"))
    trace = load_trace(tmp_path / "whole0.json")
    starts = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    assert [(e["tid"], e["ts"]) for e in starts] == [(11000, 5.8)]
    assert trace["megaKernelCycleTrace"]["subTracks"] == [
        {"pid": 3, "tid": 11000, "parentTid": 1000, "records": 2}
    ]


def test_report_names_that_are_markup_show_as_text(store: Store, tmp_path: Path) -> None:
    """``<!--<script>`` keeps a script element open to the page's end unless escaped."""
    name = "Moe<!--<script></script>&\u2028"
    write_run(store, SimulatedMoeKernel(experts=2, tiles=2), seed=1, commit="abcd", name=name)
    assert (
        script_json({"k": name})
        == '{"k":"Moe\\u003c!--\\u003cscript\\u003e\\u003c/script\\u003e\\u0026\\u2028"}'
    )
    page = write_report(store, "commit:abcd", tmp_path / "r.html")
    dom = rendered(page)
    assert 'data-ready="1"' in dom
    assert "data-error" not in dom
    stages = dom.split('id="stages"')[1].split("</table>")[0]
    shown = "Moe&lt;!--&lt;script&gt;&lt;/script&gt;&amp;\u2028"
    assert stages.count(f'<td class="text">{shown}</td>') == 5
    assert f"{shown}, run run-abcd-1" in dom
