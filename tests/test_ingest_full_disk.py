"""``mcprof ingest-buffer`` on a disk that fills: no rows and no run are left behind."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from golden import AIC, TASK7, Slot, pack

from multicore_profiler.cli import main
from multicore_profiler.storage.store import open_store


def test_a_full_disk_leaves_no_phantom_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    buffer = tmp_path / "dump.bin"
    buffer.write_bytes(pack(1, 1, 16, 16, [Slot(AIC, 0, 100, TASK7)]))
    root = tmp_path / "store"
    open_store(root).close()
    real_write = pq.ParquetWriter.write_table
    full = []

    def write_table(self: pq.ParquetWriter, table: pa.Table, *args: object, **kw: object) -> None:
        if "record_index" in table.column_names:
            full.append(True)  # the disk fills at the step's first file, and stays full
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(self, table, *args, **kw)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    code = main(
        [
            "ingest-buffer",
            str(buffer),
            *("--aic-slots", "1", "--aiv-slots", "1", "--aic-capacity", "16"),
            *("--aiv-capacity", "16", "--freq-mhz", "50", "--run", "r1"),
            *("--store", str(root)),
        ]
    )
    out, err = capsys.readouterr()
    assert (code, out, err) == (
        1,
        "",
        f"mcprof: error: cannot write records to the store at {root}: No space left on device\n",
    )
    monkeypatch.undo()
    with open_store(root, create=False) as store:
        assert store.sql(
            """SELECT (SELECT count(*) FROM raw_runs) AS runs,
                      (SELECT count(*) FROM raw_invocations) AS invocations"""
        ).to_pylist() == [{"runs": 0, "invocations": 0}]
