"""FlashInfer, Mirage MPK and Triton-distributed raw buffers imported into the store: each
tag layout, the slot position as the writer, pairing, instants, the 32-bit ns wrap, and
every refusal with the place it names."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from tagged_packer import (
    BEGIN,
    END,
    INSTANT,
    fi,
    flashinfer_tag,
    launch_rows,
    mpk_tag,
    numpy_decode,
    pack,
    triton_tag,
    write_synthetic,
)

from multicore_profiler import open_store
from multicore_profiler.abi import DESC_TRIGGER_EVENT, DESC_WAIT_DEPENDENCY, CoreType
from multicore_profiler.errors import DroppedRecordsWarning, ImportFormatError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.ingest import import_tagged
from multicore_profiler.ingest.import_tagged import MPK_TASK_NAMES, read
from multicore_profiler.ingest.imports import ImportOptions, import_profile

SM, CTA = int(CoreType.SM), int(CoreType.CTA)


def rows(path: Path, format: str, **options: object) -> tuple[list[tuple], object]:
    """The records of a buffer file's one launch, as tuples of ``COLUMNS`` in core and
    record order, and the launch."""
    (launch,) = read(path, ImportOptions(format=format, **options))  # type: ignore[arg-type]
    return launch_rows(launch), launch


def save(tmp_path: Path, buffer: np.ndarray, name: str = "buf.npy") -> Path:
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, buffer)
    elif name.endswith(".bin"):
        path.write_bytes(buffer.astype("<u8").tobytes())
    else:
        torch.save(torch.from_numpy(buffer), path)
    return path


def mla_buffer() -> np.ndarray:
    """Two blocks x two groups (MLA-like): block 1 group 1 on SM 7 runs event 3 and then an
    instant 4 as its last record; block 0 group 1 nests event 2 in event 1."""
    return pack(
        2,
        2,
        {
            (0, 0): [fi(BEGIN, 0, 0, 5, 1000), fi(END, 0, 0, 5, 1500)],
            (0, 1): [
                fi(BEGIN, 1, 0, 5, 1100),
                fi(BEGIN, 2, 0, 5, 1200),
                fi(END, 2, 0, 5, 1300),
                fi(END, 1, 0, 5, 1400),
            ],
            (1, 1): [fi(BEGIN, 3, 1, 7, 1050), fi(END, 3, 1, 7, 1250), fi(INSTANT, 4, 1, 7, 1260)],
        },
    )


def test_flashinfer_spans_by_slot_position(tmp_path: Path) -> None:
    records, launch = rows(save(tmp_path, mla_buffer()), "flashinfer", names={0: "prefill"})
    assert records == [
        (SM, 5, 0, 1000, 1500, 0, 0, 0, 0, "compute"),
        (SM, 5, 1, 1100, 1400, 1, 1, 0, 1, "compute"),
        (SM, 5, 2, 1200, 1300, 2, 2, 0, 1, "compute"),
        (SM, 7, 0, 1050, 1250, 3, 3, 0, 1001, "compute"),
        (SM, 7, 1, 1260, 1260, 4, 4, 0, 1001, "compute"),
    ]
    assert launch.stage_names == {
        0: "prefill", 1: "event_1", 2: "event_2", 3: "event_3", 4: "event_4"
    }  # fmt: skip
    assert (launch.kernel_name, launch.owner_label) == ("flashinfer", "BlockX1000+Group")
    assert (launch.clock_domain, launch.frequency_hz, launch.anchor_cycle) == ("shared", 1e9, 1000)


def test_flashinfers_own_decoder_would_mislabel_groups(tmp_path: Path) -> None:
    """FlashInfer's decoder takes block = field // ngroups: for block 1 (field 1) with two
    groups it says block 0 group 1; the slot position says block 1 (owner 1001)."""
    field = flashinfer_tag(BEGIN, 3, 1, 7) >> 12 & 0xFFF
    assert (field // 2, field % 2) == (0, 1)
    records, _ = rows(save(tmp_path, mla_buffer()), "flashinfer")
    assert {r[8] for r in records if r[1] == 7} == {1001}


@pytest.mark.parametrize("name", ["buf.npy", "buf.bin", "buf.pt"])
def test_each_file_kind_reads_the_same(tmp_path: Path, name: str) -> None:
    expected, _ = rows(save(tmp_path, mla_buffer()), "flashinfer")
    assert rows(save(tmp_path, mla_buffer(), name), "flashinfer")[0] == expected


def test_pt_of_int64_view_and_of_other_objects(tmp_path: Path) -> None:
    expected, _ = rows(save(tmp_path, mla_buffer()), "flashinfer")
    path = tmp_path / "i64.pt"
    torch.save(torch.from_numpy(mla_buffer().view(np.int64)), path)
    assert rows(path, "flashinfer")[0] == expected
    torch.save({"buf": torch.from_numpy(mla_buffer())}, tmp_path / "dict.pt")
    with pytest.raises(ImportFormatError, match=r"dict\.pt: holds a dict, not a single tensor"):
        rows(tmp_path / "dict.pt", "flashinfer")
    torch.save(torch.zeros(4, dtype=torch.float32), tmp_path / "f.pt")
    with pytest.raises(ImportFormatError, match=r"torch\.float32, not 64-bit slots"):
        rows(tmp_path / "f.pt", "flashinfer")


def test_a_pickled_object_is_never_unpickled(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple:
            return (exec, ("raise SystemExit('ran')",))

    torch.save(Evil(), tmp_path / "evil.pt")
    with pytest.raises(ImportFormatError, match=r"evil\.pt: not a torch tensor file"):
        rows(tmp_path / "evil.pt", "flashinfer")


def test_truncated_files(tmp_path: Path) -> None:
    data = mla_buffer().tobytes()
    (tmp_path / "t.bin").write_bytes(data[:-3])
    with pytest.raises(ImportFormatError, match=r"t\.bin: 133 bytes is not a whole number"):
        rows(tmp_path / "t.bin", "flashinfer")
    npy = save(tmp_path, mla_buffer()).read_bytes()
    (tmp_path / "t.npy").write_bytes(npy[:-16])
    with pytest.raises(ImportFormatError, match=r"t\.npy: cannot read the buffer"):
        rows(tmp_path / "t.npy", "flashinfer")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ImportFormatError, match=r"must be saved as \.npy, \.pt or \.bin"):
        rows(tmp_path / "x.json", "flashinfer")


def test_a_buffer_cut_inside_a_writers_column_drops_its_open_begin(tmp_path: Path) -> None:
    """Cut after writer 1 of record row 1: writer (0, 1)'s begins of events 1 and 2 and
    writer (1, 1)'s begin of event 3 had their ends beyond the buffer; they are counted, not
    imported. Writer (0, 0) still ends its span in row 1."""
    buffer = mla_buffer()[: 1 + 4 + 2]
    with pytest.warns(DroppedRecordsWarning, match="3 begins lost their end"):
        records, launch = rows(save(tmp_path, buffer), "flashinfer")
    assert launch.dropped == {(SM, 5): 2, (SM, 7): 1}
    assert [r[3:5] for r in records] == [(1000, 1500)]


def test_unmatched_begin_or_end_inside_the_buffer_is_refused(tmp_path: Path) -> None:
    lone_end = pack(1, 1, {(0, 0): [fi(END, 2, 0, 3, 10)]}, rows=2)
    with pytest.raises(ImportFormatError, match=r"slot 1 \(record 0 of writer column 0, "
                       r"event 2\) is an end without its begin"):  # fmt: skip
        rows(save(tmp_path, lone_end), "flashinfer")
    two_begins = pack(1, 1, {(0, 0): [fi(BEGIN, 2, 0, 3, 10), fi(BEGIN, 2, 0, 3, 20)]}, rows=4)
    with pytest.raises(ImportFormatError, match=r"slot 2 .* is a begin without its end"):
        rows(save(tmp_path, two_begins), "flashinfer")
    open_begin = pack(1, 1, {(0, 0): [fi(BEGIN, 2, 0, 3, 10)]}, rows=3)
    with pytest.raises(ImportFormatError, match=r"slot 1 .* is a begin without its end"):
        rows(save(tmp_path, open_begin), "flashinfer")


def test_wrap_of_the_32_bit_counter_is_unwrapped_exactly(tmp_path: Path) -> None:
    """Writer 0 begins 100 ns before the wrap and ends 200 ns after it; writer 1's first
    record comes after the wrap. The earliest record keeps its raw value."""
    top = 2**32
    buffer = pack(
        2,
        1,
        {
            (0, 0): [fi(BEGIN, 0, 0, 1, top - 100), fi(END, 0, 0, 1, 200)],
            (1, 0): [fi(BEGIN, 0, 1, 2, 50), fi(END, 0, 1, 2, 2_000_000_000)],
        },
    )
    records, launch = rows(save(tmp_path, buffer), "flashinfer")
    assert [r[1:5] for r in records] == [
        (1, 0, top - 100, top + 200),
        (2, 0, top + 50, top + 2_000_000_000),
    ]
    assert launch.anchor_cycle == top - 100


def test_a_step_the_wrap_makes_ambiguous_is_refused(tmp_path: Path) -> None:
    gap = pack(1, 1, {(0, 0): [fi(BEGIN, 0, 0, 1, 10), fi(END, 0, 0, 1, 10 + 2**31)]})
    message = r"record 1 of writer column 0 \(slot 2\) follows the previous one by 2147483648 ns"
    with pytest.raises(ImportFormatError, match=message + r" .* cannot be decided"):
        rows(save(tmp_path, gap), "flashinfer")
    apart = pack(
        3,
        1,
        {
            (b, 0): [fi(BEGIN, 0, b, 1, t), fi(END, 0, b, 1, t + 5)]
            for b, t in enumerate((0, 1_500_000_000, 3_000_000_000))
        },
    )
    with pytest.raises(ImportFormatError, match=r"first records lie .* their order cannot"):
        rows(save(tmp_path, apart), "flashinfer")


def test_zero_records_and_bad_headers(tmp_path: Path) -> None:
    with pytest.raises(ImportFormatError, match="holds no record"):
        rows(save(tmp_path, pack(4, 1, {}, rows=3)), "flashinfer")
    too_big = pack(2, 1, {(0, 0): [fi(BEGIN, 0, 0, 1, 5), fi(END, 0, 0, 1, 6)]})
    too_big[0] = 50 | 2 << 32
    with pytest.raises(ImportFormatError, match=r"50 blocks x 2 groups, which do not fit "
                       r"the buffer's 5 slots"):  # fmt: skip
        rows(save(tmp_path, too_big), "flashinfer")
    with pytest.raises(ImportFormatError, match=r"header .* do not fit"):
        rows(save(tmp_path, np.zeros(3, np.uint64)), "flashinfer")
    wrong = mla_buffer()
    wrong[0] = 4 | 1 << 32  # 4 blocks of 1 group: slot 2 is then block 1's column
    with pytest.raises(ImportFormatError, match=r"slot 2 lies in writer \(block 1, group 0\)"
                       r".* names writer field 0: the header contradicts"):  # fmt: skip
        rows(save(tmp_path, wrong), "flashinfer")
    gap = pack(1, 1, {(0, 0): [fi(BEGIN, 0, 0, 1, 5), fi(END, 0, 0, 1, 6)]}, rows=4)
    gap[3], gap[4] = gap[1], gap[2]
    gap[1] = 0
    with pytest.raises(ImportFormatError, match="slot 2 holds a record after an empty slot"):
        rows(save(tmp_path, gap), "flashinfer")
    with pytest.raises(ImportFormatError, match="holds float64, not 64-bit slots"):
        rows(save(tmp_path, np.zeros(4)), "flashinfer")


def test_begin_and_end_on_different_sms_is_refused(tmp_path: Path) -> None:
    buffer = pack(1, 1, {(0, 0): [fi(BEGIN, 0, 0, 1, 5), fi(END, 0, 0, 2, 6)]})
    with pytest.raises(
        ImportFormatError, match="slots 1 and 2 begin and end one span on SMs 1 and 2"
    ):
        rows(save(tmp_path, buffer), "flashinfer")


def test_block_ids_past_12_bits_are_refused(tmp_path: Path) -> None:
    """Block 4096's tag ORs bit 12 of the block into the SM id: the SM is unknowable."""
    buffer = pack(4097, 1, {(4096, 0): [fi(BEGIN, 0, 4096, 3, 5), fi(END, 0, 4096, 3, 6)]})
    assert flashinfer_tag(BEGIN, 0, 4096, 3) >> 24 == 3 | 1
    with pytest.raises(ImportFormatError, match=r"block 4096 \(slot 4097\) is past "
                       r"FlashInfer's 12-bit block field"):  # fmt: skip
        rows(save(tmp_path, buffer), "flashinfer")


def test_a_pre_1305_tag_is_caught_by_the_slot_position(tmp_path: Path) -> None:
    """Before #1305 bits 12.. held block x ngroups + group: writer (1, 1) wrote field 3."""
    old = (BEGIN | 0 << 2 | 3 << 12), 5
    buffer = pack(2, 2, {(1, 1): [old, (old[0] | END, 6)]})
    with pytest.raises(ImportFormatError, match=r"block 1, group 1\).* field 3"):
        rows(save(tmp_path, buffer), "flashinfer")


def mpk_buffer() -> np.ndarray:
    """Worker 0: embedding (event_no 0), its TASK_SCHD_EVENTS trigger, then task type 300
    (no name); worker 1: two RMS_NORM (119) tasks, event_no 0 and 1."""
    w0 = [
        (mpk_tag(BEGIN, 101, 0, 0), 500),
        (mpk_tag(END, 101, 0, 0), 900),
        (mpk_tag(BEGIN, 201, 0, 0), 910),
        (mpk_tag(END, 201, 0, 0), 950),
        (mpk_tag(BEGIN, 300, 0, 1), 1000),
        (mpk_tag(END, 300, 0, 1), 1100),
    ]
    w1 = [
        (mpk_tag(BEGIN, 119, 1, 0), 600),
        (mpk_tag(END, 119, 1, 0), 700),
        (mpk_tag(BEGIN, 119, 1, 1), 800),
        (mpk_tag(END, 119, 1, 1), 990),
    ]
    return pack(2, 1, {(0, 0): w0, (1, 0): w1})


def test_mpk_tasks_triggers_and_names(tmp_path: Path) -> None:
    records, launch = rows(save(tmp_path, mpk_buffer()), "mpk")
    assert records == [
        (CTA, 0, 0, 500, 900, 101, 0, 0, 0, "compute"),
        (CTA, 0, 1, 910, 950, DESC_TRIGGER_EVENT, 0, 0, 0, "trigger"),
        (CTA, 0, 2, 1000, 1100, 300, 1, 0, 0, "compute"),
        (CTA, 1, 0, 600, 700, 119, 8192, 0, 1, "compute"),
        (CTA, 1, 1, 800, 990, 119, 8193, 1, 1, "compute"),
    ]
    assert launch.stage_names == {
        101: "TASK_EMBEDDING", 119: "TASK_RMS_NORM", 201: "TASK_SCHD_EVENTS", 300: "TASK_300"
    }  # fmt: skip
    assert (launch.kernel_name, launch.owner_label) == ("mpk", "Block")
    assert MPK_TASK_NAMES[10] == "TASK_BEGIN_TASK_GRAPH"
    assert len(MPK_TASK_NAMES) == 109


def test_mpk_pairs_by_event_no_and_its_worker_field_wraps(tmp_path: Path) -> None:
    """Worker 256's tag holds 0 (8 bits); a begin of event_no 5 is not closed by event_no 6."""
    ok = pack(
        257, 1, {(256, 0): [(mpk_tag(BEGIN, 120, 256, 3), 1), (mpk_tag(END, 120, 256, 3), 2)]}
    )
    records, _ = rows(save(tmp_path, ok), "mpk")
    assert records == [(CTA, 256, 0, 1, 2, 120, 256 * 8192 + 3, 0, 256, "compute")]
    crossed = pack(
        1, 1, {(0, 0): [(mpk_tag(BEGIN, 120, 0, 5), 1), (mpk_tag(END, 120, 0, 6), 2)]}, rows=3
    )
    with pytest.raises(ImportFormatError, match=r"slot 1 .* is a begin without its end"):
        rows(save(tmp_path, crossed), "mpk")


def triton_buffer() -> np.ndarray:
    """Two programs on SMs 9 and 4, one group: program 0 waits (type 3) then runs task 1,
    waits, runs task 2; program 1 runs task 1 with no wait, then a wait with no task after."""
    t = triton_tag
    p0 = [
        (t(True, 3, 0), 100), (t(False, 3, 0), 150), (t(True, 1, 0), 150), (t(False, 1, 0), 400),
        (t(True, 3, 0), 400), (t(False, 3, 0), 420), (t(True, 2, 0), 425), (t(False, 2, 0), 600),
    ]  # fmt: skip
    p1 = [(t(True, 1, 1), 120), (t(False, 1, 1), 300), (t(True, 3, 1), 300), (t(False, 3, 1), 700)]
    return pack(2, 1, {(0, 0): p0, (1, 0): p1}, block_sms={0: 9, 1: 4})


def test_triton_distributed_waits_from_the_names(tmp_path: Path) -> None:
    records, launch = rows(
        save(tmp_path, triton_buffer()), "triton-distributed", names={1: "qkv", 2: "attn"}
    )
    wait = DESC_WAIT_DEPENDENCY
    assert records == [
        (SM, 4, 0, 120, 300, 1, 2, 0, 1, "compute"),
        (SM, 4, 1, 300, 700, wait, 0xFFFF_FFFF, 1, 1, "wait"),
        (SM, 9, 0, 100, 150, wait, 0, 0, 0, "wait"),
        (SM, 9, 1, 150, 400, 1, 0, 1, 0, "compute"),
        (SM, 9, 2, 400, 420, wait, 1, 2, 0, "wait"),
        (SM, 9, 3, 425, 600, 2, 1, 0, 0, "compute"),
    ]
    assert launch.stage_names == {1: "qkv", 2: "attn"}
    assert launch.kernel_name == "triton-distributed"


def test_triton_distributed_without_names_has_no_waits(tmp_path: Path) -> None:
    records, launch = rows(save(tmp_path, triton_buffer()), "triton-distributed")
    assert {r[5] for r in records} == {1, 2, 3}
    assert {r[9] for r in records} == {"compute"}
    assert launch.stage_names == {1: "task_1", 2: "task_2", 3: "task_3"}
    named, _ = rows(
        save(tmp_path, triton_buffer()), "triton-distributed", names={3: "scoreboard_wait_deps"}
    )
    assert [r[9] for r in named].count("wait") == 3


def test_triton_distributed_meta_slots(tmp_path: Path) -> None:
    no_meta = triton_buffer()
    no_meta[2] = 0x7FFF_FFFF_FFFF_FFFF
    with pytest.raises(ImportFormatError, match=r"block 1 wrote records but not its meta slot"):
        rows(save(tmp_path, no_meta), "triton-distributed")
    wide = triton_buffer()
    wide[2] = 1 | 300 << 32
    with pytest.raises(
        ImportFormatError, match="meta slot 2 gives block 1 SM id 300, beyond 8 bits"
    ):
        rows(save(tmp_path, wide), "triton-distributed")
    other = triton_buffer()
    other[2] = 0 | 4 << 32
    with pytest.raises(ImportFormatError, match="meta slot 2 names block 0, not block 1"):
        rows(save(tmp_path, other), "triton-distributed")


def test_end_to_end_store_views_and_export(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    path = save(tmp_path, triton_buffer())
    imported = import_profile(
        store, [path], format="triton-distributed", names={1: "qkv", 2: "attn"}, rank=3
    )
    assert imported.records == 6
    ns = store.sql(
        "SELECT block_id, record_index, stage, phase, ts_ns, dur_ns FROM records_ns "
        "ORDER BY block_id, record_index"
    ).to_pylist()
    assert [tuple(r.values()) for r in ns] == [
        (4, 0, "qkv", "compute", 20, 180),
        (4, 1, None, "wait", 200, 400),
        (9, 0, "qkv", "wait", 0, 50),
        (9, 1, "qkv", "compute", 50, 250),
        (9, 2, "attn", "wait", 300, 20),
        (9, 3, "attn", "compute", 325, 175),
    ]
    stats = store.sql(
        "SELECT stage, tasks, compute_total_us FROM stage_stats ORDER BY stage"
    ).to_pylist()
    assert stats == [
        {"stage": "attn", "tasks": 1, "compute_total_us": 0.175},
        {"stage": "qkv", "tasks": 2, "compute_total_us": 0.43},
        {"stage": None, "tasks": 0, "compute_total_us": None},
    ]
    breakdown = store.sql(
        "SELECT block_id, compute_ns, wait_ns, makespan_ns FROM core_breakdown ORDER BY block_id"
    ).to_pylist()
    assert breakdown == [
        {"block_id": 4, "compute_ns": 180, "wait_ns": 400, "makespan_ns": 600},
        {"block_id": 9, "compute_ns": 425, "wait_ns": 70, "makespan_ns": 600},
    ]
    export_chrome_trace(store, tmp_path / "t.json")
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    slices = sorted((e["tid"], e["name"], e["ts"], e["dur"]) for e in events if e.get("ph") == "X")
    assert slices == [
        (3004, "WaitDependency", 0.2, 0.4),
        (3004, "qkv", 0.02, 0.18),
        (3009, "attn", 0.325, 0.175),
        (3009, "attn_WaitDependency", 0.3, 0.02),
        (3009, "qkv", 0.05, 0.25),
        (3009, "qkv_WaitDependency", 0.0, 0.05),
    ]


def test_synthetic_buffer_and_numpy_baseline(tmp_path: Path) -> None:
    count = write_synthetic(tmp_path / "s.npy", 10_000)
    assert count == 36 * 264
    fields = numpy_decode(tmp_path / "s.npy")
    assert len(fields["time"]) == count
    assert set(fields["event"].tolist()) == set(range(9))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records, launch = rows(tmp_path / "s.npy", "flashinfer")
    assert len(records) == count // 2
    assert {r[1] for r in records} == set(range(132))
    assert launch.stage_names[8] == "event_8"


def test_triton_distributed_groups_and_block_zero_on_sm_zero(tmp_path: Path) -> None:
    """Two groups: writer (1, 1) tags pid x ngroups + group = 3; block 0's meta slot on SM 0
    is all zero bits, a real slot."""
    t = triton_tag
    buffer = pack(
        2,
        2,
        {
            (0, 1): [(t(True, 5, 1), 10), (t(False, 5, 1), 30)],
            (1, 1): [(t(True, 5, 3), 20), (t(False, 5, 3), 25)],
        },
        block_sms={0: 0, 1: 6},
    )
    assert buffer[1] == 0
    records, launch = rows(save(tmp_path, buffer), "triton-distributed")
    assert records == [
        (SM, 0, 0, 10, 30, 5, 0, 0, 1, "compute"),
        (SM, 6, 0, 20, 25, 5, 1, 1, 1001, "compute"),
    ]
    assert launch.owner_label == "BlockX1000+Group"
    wrong = buffer.copy()
    wrong[1 + 2 + 2 + 1] = t(True, 5, 2) | 20 << 32  # writer 3's slot with field 2
    with pytest.raises(ImportFormatError, match=r"slot 6 lies in writer \(block 1, group 1\)"):
        rows(save(tmp_path, wrong), "triton-distributed")


def test_mpk_instant_is_a_zero_length_record(tmp_path: Path) -> None:
    buffer = pack(1, 1, {(0, 0): [(mpk_tag(INSTANT, 10, 0, 4), 77)]})
    records, launch = rows(save(tmp_path, buffer), "mpk")
    assert records == [(CTA, 0, 0, 77, 77, 10, 4, 0, 0, "compute")]
    assert launch.stage_names == {10: "TASK_BEGIN_TASK_GRAPH"}


def test_big_endian_and_int64_npy_read_the_same(tmp_path: Path) -> None:
    expected, _ = rows(save(tmp_path, mla_buffer()), "flashinfer")
    np.save(tmp_path / "be.npy", mla_buffer().astype(">u8"))
    assert rows(tmp_path / "be.npy", "flashinfer")[0] == expected
    np.save(tmp_path / "i8.npy", mla_buffer().view(np.int64))
    assert rows(tmp_path / "i8.npy", "flashinfer")[0] == expected


def test_kernel_name_and_rank_options(tmp_path: Path) -> None:
    _, launch = rows(save(tmp_path, mpk_buffer()), "mpk", kernel_name="qwen3_mpk", rank=5)
    assert (launch.kernel_name, launch.producer, launch.rank) == ("qwen3_mpk", "mpk", 5)


def wrap_buffer() -> np.ndarray:
    top = 2**32
    return pack(
        3,
        1,
        {
            (0, 0): [fi(BEGIN, 0, 0, 1, top - 100), fi(END, 0, 0, 1, 200)],
            (1, 0): [fi(BEGIN, 1, 1, 2, 50), fi(END, 1, 1, 2, 90)],
            (2, 0): [fi(BEGIN, 0, 2, 1, top - 300), fi(END, 0, 2, 1, top - 10)],
        },
    )


@pytest.mark.parametrize(
    ("make", "format", "names"),
    [
        (mla_buffer, "flashinfer", {}),
        (wrap_buffer, "flashinfer", {}),
        (mpk_buffer, "mpk", {}),
        (triton_buffer, "triton-distributed", {1: "qkv", 2: "attn"}),
    ],
)
def test_writer_batches_decode_as_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: object, format: str, names: dict
) -> None:
    """One writer per batch (two passes over the buffer) gives the same records, task ids,
    record and stage numbers as one batch."""
    path = save(tmp_path, make())  # type: ignore[operator]
    whole, launch = rows(path, format, names=names)
    monkeypatch.setattr(import_tagged, "CHUNK_ROWS", 1)
    monkeypatch.setattr(import_tagged, "GATHER_BYTES", 1)  # and one row read at a time
    batched, batched_launch = rows(path, format, names=names)
    assert batched == whole
    assert (batched_launch.anchor_cycle, batched_launch.stage_names) == (
        launch.anchor_cycle,
        launch.stage_names,
    )


def test_dropped_records_are_counted_over_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(import_tagged, "CHUNK_ROWS", 1)
    with pytest.warns(DroppedRecordsWarning, match="3 begins lost their end"):
        _, launch = rows(save(tmp_path, mla_buffer()[: 1 + 4 + 2]), "flashinfer")
    assert launch.dropped == {(SM, 5): 2, (SM, 7): 1}
