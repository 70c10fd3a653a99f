"""Hostile device buffers (issue 18): cycles too far from their anchor, drops on slots that
are not full, implausible frequencies, and buffer files that are not regular files. Each
ends in one typed error naming where, or in an exact result."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from golden import AIC, AIV, Slot, pack
from hostile import refused, snapshot

from multicore_profiler.abi import BufferLayout, check_frequency
from multicore_profiler.cli import main
from multicore_profiler.errors import (
    BufferSizeError,
    DecodeError,
    DroppedRecordsWarning,
    FrequencyError,
    RecordError,
    SlotError,
)
from multicore_profiler.ingest.buffers import ingest_buffers
from multicore_profiler.ingest.decode import (
    decode_buffer,
    decode_buffers,
    read_buffer_file,
)
from multicore_profiler.storage.store import open_store

LAYOUT = BufferLayout(aic_slots=2, aiv_slots=2, aic_capacity=16, aiv_capacity=16)
LAYOUT_ARGS = ["--aic-slots=2", "--aiv-slots=2", "--aic-capacity=16", "--aiv-capacity=16"]
FAR = 2**63
"""Cycles from the anchor that a signed 64-bit count cannot hold."""
A = 10**6
"""The anchor cycle of the buffers below."""


def buffer(*slots: Slot) -> bytearray:
    return pack(2, 2, 16, 16, list(slots))


def record(start: int, end: int, task: int = 0) -> tuple[int, int, int, int, int, int]:
    return (start, end, 0x30001, task, 0, 0)


# -- item 1: cycles 2^63 or more from the anchor ---------------------------------------------


def test_a_record_2_63_minus_1_cycles_from_the_anchor_is_exact() -> None:
    raw = buffer(
        Slot(AIC, 0, A, [record(A, A + FAR - 1)]),
        Slot(AIV, 1, A, [record(A + FAR - 1, A + FAR - 1, 1)]),
    )
    timed = decode_buffer(raw, LAYOUT, frequency_hz=1e6).timed_records()  # 1 cycle per us
    assert timed["ts_us"].to_pylist() == [0.0, float(FAR - 1)]
    assert timed["dur_us"].to_pylist() == [float(FAR - 1), 0.0]
    assert timed["ts_us"][1].as_py() > 0  # the sign was wrong from 2^63 on


def test_a_record_2_63_minus_1_cycles_before_the_anchor_is_exact() -> None:
    raw = buffer(Slot(AIC, 0, FAR, [record(1, FAR)]))
    timed = decode_buffer(raw, LAYOUT, frequency_hz=1e6).timed_records()
    assert timed["ts_us"].to_pylist() == [-float(FAR - 1)]


def test_the_store_times_a_record_2_63_minus_1_cycles_out_with_its_sign(tmp_path: Path) -> None:
    raw = buffer(Slot(AIC, 0, A, [record(A + FAR - 1, A + FAR - 1)]))
    with open_store(tmp_path / "store") as store:
        ingest_buffers(store, [raw], LAYOUT, frequency_hz=1e9, run_id="r1")
        (ts,) = store.sql("SELECT ts_ns FROM records_ns")["ts_ns"].to_pylist()
    assert ts == pytest.approx(FAR - 1, rel=1e-15)


@pytest.mark.parametrize(
    ("slots", "field", "where"),
    [
        ([Slot(AIC, 0, A, [record(A, A + FAR)])], "end_cycle", (0, 0, 0)),
        (
            [
                Slot(AIC, 0, A, [record(A, A + 1)]),
                Slot(AIV, 0, A, [record(A, A), record(FAR + A, FAR + A)]),
            ],
            "start_cycle",
            (0, 2, 1),
        ),
        (
            [Slot(AIC, 1, FAR, [record(FAR, FAR)]), Slot(AIV, 1, FAR, [record(0, FAR)])],
            "start_cycle",
            (0, 3, 0),
        ),
    ],
)
def test_a_record_2_63_cycles_from_the_anchor_is_refused(
    slots: list[Slot], field: str, where: tuple[int, int, int]
) -> None:
    with pytest.raises(RecordError) as raised:
        decode_buffer(buffer(*slots), LAYOUT, frequency_hz=50e6)
    error = raised.value
    assert (error.buffer, error.slot, error.record, error.field) == (*where, field)
    message = str(error)
    assert f", record {where[2]}: {field} " in message
    assert f"is {FAR} cycles from the buffer's anchor cycle" in message
    assert "no cycle counter runs that long" in message
    assert message.endswith("(1 such record(s) in all)")


def test_a_slot_entered_2_63_cycles_from_the_anchor_is_refused_in_its_buffer() -> None:
    good = buffer(Slot(AIC, 0, A, [record(A, A + 5)]))
    bad = buffer(Slot(AIC, 0, A, [record(A, A + 5)]), Slot(AIV, 1, A + FAR))  # entered, no record
    with pytest.raises(SlotError) as raised:
        decode_buffers([good, bad], LAYOUT, frequency_hz=50e6)
    error = raised.value
    assert (error.buffer, error.slot, error.field) == (1, 3, "entry_cycle")
    assert str(error).startswith(
        f"buffer 1, slot 3 (AIV block 1): entry_cycle is {A + FAR}, 2^63 cycles or more from "
        f"the buffer's anchor cycle {A}"
    )


def test_ingest_buffer_refuses_a_record_2_63_cycles_out(capsys, tmp_path: Path) -> None:
    store = tmp_path / "store"
    good, far = tmp_path / "good.bin", tmp_path / "far.bin"
    good.write_bytes(buffer(Slot(AIC, 0, A, [record(A, A + 5)])))
    far.write_bytes(buffer(Slot(AIC, 0, A, [record(A, A + 5), record(A + 5, A + FAR)])))
    assert (
        main(["ingest-buffer", str(good), *LAYOUT_ARGS, "--freq-mhz", "50", "--store", str(store)])
        == 0
    )
    capsys.readouterr()
    message = refused(
        capsys,
        "ingest-buffer",
        str(far),
        *LAYOUT_ARGS,
        "--freq-mhz",
        "50",
        "--run",
        "r1",
        "--store",
        str(store),
        store=store,
    )
    assert message.startswith(
        f"slot 0 (AIC block 0), record 1: end_cycle {A + FAR} is {FAR} cycles"
    )


# -- item 2: dropped records counted on a slot that is not full --------------------------------

PARTIAL = Slot(AIV, 1, A, [record(A, A + 3, 1)], dropped=2)
"""One record written of 16, two dropped: a recorder that reserves a task's records."""
PARTIAL_WARNING = (
    r"device dropped 2 records on 1 slot\(s\) that are not full \(slot 3 \(AIV block 1\): "
    r"2 dropped, 1 of 16 records\); every record written is kept"
)


def test_drops_on_a_slot_that_is_not_full_keep_every_record_and_warn() -> None:
    raw = buffer(Slot(AIC, 0, A, [record(A, A + 5)]), PARTIAL)
    with pytest.warns(DroppedRecordsWarning, match=PARTIAL_WARNING) as caught:
        decoded = decode_buffer(raw, LAYOUT, frequency_hz=50e6)
    assert len(caught) == 1
    assert decoded.records["start_cycle"].to_pylist() == [A, A]
    assert decoded.records["task_id"].to_pylist() == [0, 1]
    assert decoded.dropped_counts.tolist() == [2]
    assert decoded.cores["dropped_count"].to_pylist() == [0, 2]
    assert decoded.partial_slots.to_pylist() == [[3]]


def test_full_and_partial_slots_warn_apart() -> None:
    full = Slot(AIC, 1, A, [record(A + i, A + i + 1, i) for i in range(16)], dropped=4)
    with pytest.warns(DroppedRecordsWarning) as caught:
        decoded = decode_buffers([buffer(full), buffer(full, PARTIAL)], LAYOUT, frequency_hz=50e6)
    assert [str(w.message) for w in caught] == [
        "device dropped 8 records on 2 core(s): buffer 0 AIC/1 (4), buffer 1 AIC/1 (4); "
        "their slots were full (plan a larger capacity)",
        "device dropped 2 records on 1 slot(s) that are not full (buffer 1, slot 3 (AIV block 1): "
        "2 dropped, 1 of 16 records); every record written is kept, and the invocation lists the "
        "slots in partial_slots",
    ]
    assert decoded.partial_slots.to_pylist() == [[], [3]]
    assert decoded.dropped_counts.tolist() == [4, 6]


def test_the_invocation_lists_its_partial_slots(tmp_path: Path) -> None:
    raw = [
        buffer(Slot(AIC, 0, A, [record(A, A + 5)])),
        buffer(Slot(AIC, 0, A, [record(A, A + 5)]), PARTIAL),
    ]
    with (
        open_store(tmp_path / "store") as store,
        pytest.warns(DroppedRecordsWarning, match=r"\(buffer 1, slot 3 \(AIV block 1\): 2 dropped"),
    ):
        ingest_buffers(store, raw, LAYOUT, frequency_hz=50e6, run_id="r1")
    with open_store(tmp_path / "store") as store:
        rows = store.sql(
            "SELECT invocation_id, partial_slots, record_count, dropped_count FROM invocations "
            "ORDER BY invocation_id"
        ).to_pylist()
        assert rows == [
            {"invocation_id": 0, "partial_slots": [], "record_count": 1, "dropped_count": 0},
            {"invocation_id": 1, "partial_slots": [3], "record_count": 2, "dropped_count": 2},
        ]
        assert store.sql("SELECT count(*) AS n FROM records_ns")["n"].to_pylist() == [3]


def test_an_invocation_written_before_partial_slots_reads_null(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as store:
        ingest_buffers(
            store,
            [buffer(Slot(AIC, 0, A, [record(A, A + 5)]))],
            LAYOUT,
            frequency_hz=50e6,
            run_id="r1",
        )
    (path,) = (tmp_path / "store" / "invocations").rglob("*.parquet")
    pq.write_table(pq.read_table(path, partitioning=None).drop_columns(["partial_slots"]), path)
    with open_store(tmp_path / "store") as store:
        rows = store.sql("SELECT partial_slots, record_count FROM invocations").to_pylist()
        assert rows == [{"partial_slots": None, "record_count": 1}]
        assert store.sql("SELECT ts_ns FROM records_ns")["ts_ns"].to_pylist() == [0.0]


def test_ingest_buffer_keeps_a_partial_slot_and_warns_once(capsys, tmp_path: Path) -> None:
    path = tmp_path / "partial.bin"
    path.write_bytes(buffer(Slot(AIC, 0, A, [record(A, A + 5)]), PARTIAL))
    store = ["--store", str(tmp_path / "store")]
    assert main(["ingest-buffer", str(path), *LAYOUT_ARGS, "--freq-mhz", "50", *store]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("mcprof: warning: device dropped 2 records on 1 slot(s) that are not")
    assert main(["query", "--format", "csv", "SELECT partial_slots FROM invocations", *store]) == 0
    assert capsys.readouterr().out == "partial_slots\n[3]\n"


# -- item 3: frequencies ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "unit", "message"),
    [
        (1e-314, "Hz", "cycle frequency 1e-314 Hz is out of range [1000 .. 100000000000 Hz]"),
        (999.0, "Hz", "cycle frequency 999.0 Hz is out of range [1000 .. 100000000000 Hz]"),
        (1.000001e11, "Hz", "cycle frequency 100000100000.0 Hz is out of range"),
        (1e-320, "MHz", "cycle frequency 1e-320 MHz is out of range [0.001 .. 100000 MHz]"),
        (2e5, "MHz", "cycle frequency 200000.0 MHz is out of range [0.001 .. 100000 MHz]"),
        (0, "MHz", "cycle frequency must be positive and finite, got 0 MHz"),
    ],
)
def test_a_frequency_outside_1_khz_to_100_ghz_is_refused(
    value: float, unit: str, message: str
) -> None:
    with pytest.raises(FrequencyError) as raised:
        check_frequency(value, unit=unit)
    assert str(raised.value).startswith(message)


def test_the_frequency_bounds_are_accepted() -> None:
    assert check_frequency(1e3) == 1e3
    assert check_frequency(1e11) == 1e11
    assert check_frequency(np.float32(50e6)) == 50e6
    assert check_frequency(50, unit="MHz") == 50e6
    assert check_frequency(1e5, unit="MHz") == 1e11


def test_ingest_refuses_a_tiny_frequency_and_writes_nothing(tmp_path: Path) -> None:
    with open_store(tmp_path / "store") as store:
        ingest_buffers(
            store,
            [buffer(Slot(AIC, 0, A, [record(A, A + 5)]))],
            LAYOUT,
            frequency_hz=50e6,
            run_id="r1",
        )
        before = snapshot(tmp_path / "store")
        with pytest.raises(FrequencyError, match=r"cycle frequency 1e-314 Hz is out of range"):
            ingest_buffers(
                store,
                [buffer(Slot(AIC, 0, A, [record(A, A + 5)]))],
                LAYOUT,
                frequency_hz=1e-314,
                run_id="r1",
            )
    assert snapshot(tmp_path / "store") == before


# -- item 4: buffer files that are not regular files --------------------------------------------


@contextmanager
def bounded(seconds: int) -> Iterator[None]:
    """Fail instead of hanging when the body blocks (a FIFO opened for reading)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "launch.bin"
    os.mkfifo(fifo)
    link = tmp_path / "link.bin"
    link.symlink_to(fifo)
    for path in (fifo, link):
        with bounded(20), pytest.raises(DecodeError) as raised:
            read_buffer_file(path, LAYOUT)
        assert str(raised.value) == f"buffer file {path} is a FIFO (named pipe), not a regular file"


def test_what_is_not_a_regular_file_is_refused_by_kind(tmp_path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "s"))
    try:
        for path, kind in (
            (tmp_path, "a directory"),
            (Path("/dev/null"), "a character device"),
            (tmp_path / "s", "a socket"),
        ):
            with pytest.raises(DecodeError) as raised:
                read_buffer_file(path)
            assert str(raised.value) == f"buffer file {path} is {kind}, not a regular file"
    finally:
        server.close()


def test_a_missing_buffer_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.bin"
    with pytest.raises(DecodeError) as raised:
        read_buffer_file(missing, LAYOUT)
    assert str(raised.value) == f"cannot read buffer file {missing}: No such file or directory"
    (tmp_path / "dangling.bin").symlink_to(missing)
    with pytest.raises(DecodeError, match=r"dangling\.bin: No such file or directory"):
        read_buffer_file(tmp_path / "dangling.bin")


def test_a_buffer_file_is_read_whole_and_checked_against_its_layout(tmp_path: Path) -> None:
    raw = buffer(Slot(AIC, 0, A, [record(A, A + 5)]))
    path = tmp_path / "launch.bin"
    path.write_bytes(raw)
    for layout in (LAYOUT, None):
        data = read_buffer_file(path, layout)
        assert data.dtype == np.uint8
        assert data.tobytes() == bytes(raw)
    path.write_bytes(bytes(raw) + b"\0")
    with pytest.raises(BufferSizeError) as raised:
        read_buffer_file(path, LAYOUT)
    assert str(raised.value) == (
        f"the buffer holds {len(raw) + 1} bytes but its layout {LAYOUT} needs {len(raw)} "
        f"(buffer file {path})"
    )
    path.write_bytes(b"")
    assert read_buffer_file(path).tobytes() == b""


def test_a_file_that_holds_more_than_its_size_says_is_refused() -> None:
    status = Path("/proc/self/status")  # a regular file of size 0 that holds text
    with pytest.raises(DecodeError) as raised:
        read_buffer_file(status)
    assert str(raised.value) == (
        f"buffer file {status} changed while it was read: 0 bytes when opened, more when read"
    )
