"""HazyResearch Megakernels' timings imported: the v1 pickle, the throughput branch's pickle
and the ``.mkprof`` file, packed by ``tests/hazy_packer.py`` (no public sample exists).
Every expected value below was worked out by hand from the slot tables in the importer's
docstring; the comments show the arithmetic."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from multicore_profiler import open_store
from multicore_profiler.errors import ImportFormatError
from multicore_profiler.export.chrome_trace import export_chrome_trace
from multicore_profiler.ingest import import_hazy
from multicore_profiler.ingest.imports import ImportOptions, import_profile, read_profiles
from tests import hazy_packer as hp

NO = 0xFFFFFFFF
QKV, ATTN = "LayerNorm_QKV_MatVecRopeAppend", "PartialAttention"

# v1: 3 SMs x 3 queue slots, clock64 cycles since each CTA's start. SM 2 ran nothing.
V1_SLOTS = {
    # controller 0->3 (4 closes), loader 5/6, launcher 7/8, consumer warps 0 and 1
    # (11/12, 13/14), storer 9/10, gmem wait 44/45, gmem store 46/47
    (0, 0): {0: 120, 3: 180, 4: 2400, 5: 200, 6: 1500, 7: 210, 8: 900, 11: 220, 12: 1900,
             13: 230, 14: 1950, 9: 1960, 10: 2300, 44: 300, 45: 700, 46: 2000, 47: 2250},
    # the launcher's end (8) was not recorded: no launcher record
    (0, 1): {0: 1600, 3: 1700, 4: 3500, 5: 1710, 6: 2600, 7: 1720, 11: 2700, 12: 3300,
             9: 3310, 10: 3400},
    (1, 0): {0: 100, 3: 150, 4: 2000, 5: 160, 6: 1200, 11: 170, 12: 1800, 44: 200, 45: 900},
}  # fmt: skip
V1_OPCODES = {(0, 0): 1, (0, 1): 2, (1, 0): 1}
V1_CLASSES = [[QKV, ATTN], [QKV], []]
# (block, record_index, start, end, desc, task, stage_task_index, owner, phase); desc =
# opcode + 0x1000 x unit (1 controller, 2 loader, 3 launcher, 4 consumer, 5 storer,
# 6 gmem store), 65536 the gmem wait; task = sm x 3 + queue index.
V1_RECORDS = [
    # SM 0, instruction 0: first start 120 (slot 0), last end 2400 (slot 4)
    (0, 0, 120, 2400, 1, 0, 0, NO, "compute"),
    (0, 1, 120, 180, 0x1001, 0, 0, NO, "compute"),
    (0, 2, 200, 1500, 0x2001, 0, 0, NO, "compute"),
    (0, 3, 210, 900, 0x3001, 0, 0, NO, "compute"),
    (0, 4, 220, 1900, 0x4001, 0, 0, 0, "compute"),
    (0, 5, 230, 1950, 0x4001, 0, 1, 1, "compute"),
    (0, 6, 300, 700, 0x10000, 0, 0, NO, "wait"),
    # SM 0, instruction 1 (opcode 2): 1600 .. 3500
    (0, 7, 1600, 3500, 2, 1, 0, NO, "compute"),
    (0, 8, 1600, 1700, 0x1002, 1, 0, NO, "compute"),
    (0, 9, 1710, 2600, 0x2002, 1, 0, NO, "compute"),
    (0, 10, 1960, 2300, 0x5001, 0, 0, NO, "compute"),
    (0, 11, 2000, 2250, 0x6001, 0, 0, NO, "compute"),
    (0, 12, 2700, 3300, 0x4002, 1, 0, 0, "compute"),
    (0, 13, 3310, 3400, 0x5002, 1, 0, NO, "compute"),
    # SM 1, instruction 0 (task 3): 100 .. 2000
    (1, 0, 100, 2000, 1, 3, 1, NO, "compute"),
    (1, 1, 100, 150, 0x1001, 3, 1, NO, "compute"),
    (1, 2, 160, 1200, 0x2001, 3, 1, NO, "compute"),
    (1, 3, 170, 1800, 0x4001, 3, 2, 0, "compute"),
    (1, 4, 200, 900, 0x10000, 3, 1, NO, "wait"),
]
UNIT_NAMES = ("controller", "loader", "launcher", "consumer", "storer", "gmem_store")


def v1_names(names: dict[int, str]) -> dict[int, str]:
    out = {}
    for op, name in names.items():
        out[op] = name
        out.update({op + 0x1000 * (u + 1): f"{name}.{unit}" for u, unit in enumerate(UNIT_NAMES)})
    return out


def write_v1(path: Path, **options: object) -> Path:
    return hp.write_pickle(
        path,
        hp.timings(3, 3, V1_SLOTS),
        hp.instructions(3, 3, V1_OPCODES),
        **{"classes": V1_CLASSES, "cost_per_sm": [1.5, 0.5, 0.0], **options},
    )


def launches(path: Path, **options: object) -> list:
    return list(read_profiles([path], ImportOptions(format="hazy", **options)))


def decoded(path: Path) -> list[list[tuple]]:
    """Every launch's records (their errors raise as the records stream)."""
    return [rows(launch) for launch in launches(path)]


def rows(launch) -> list[tuple]:
    table = pa.concat_tables(list(launch.records))
    assert set(table["core_type"].to_pylist()) == {3}  # CoreType.SM
    columns = ("block_id", "record_index", "start_cycle", "end_cycle", "desc_id", "task_id")
    columns += ("stage_task_index", "owner_id", "phase")
    return list(zip(*(table[c].to_pylist() for c in columns), strict=True))


def test_v1_pickle_of_torch_tensors(tmp_path: Path) -> None:
    (launch,) = launches(write_v1(tmp_path / "t.pkl"))
    assert rows(launch) == V1_RECORDS
    assert launch.stage_names == v1_names({1: QKV, 2: ATTN})  # from python_instructions
    assert launch.clock_domain == "per_core"
    assert launch.frequency_hz == 1.8e9  # the producer's plot scripts' 1800 MHz
    assert (launch.producer, launch.producer_format) == ("hazy", "timings-pickle:v1")
    assert (launch.owner_label, launch.rank, launch.kernel_name) == ("warp", 0, "megakernel")


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_v1_pickle_of_numpy_arrays(tmp_path: Path, protocol: int) -> None:
    path = write_v1(tmp_path / "n.pkl", tensors=False, protocol=protocol)
    (launch,) = launches(path)
    assert rows(launch) == V1_RECORDS


def test_given_names_frequency_and_rank(tmp_path: Path) -> None:
    path = write_v1(tmp_path / "t.pkl", classes=None)
    (launch,) = launches(path, names={2: "attn"}, frequency_hz=2.1e9, rank=3, kernel_name="k")
    assert launch.stage_names == v1_names({1: "op_1", 2: "attn"})
    assert (launch.frequency_hz, launch.rank, launch.kernel_name) == (2.1e9, 3, "k")


def test_records_stream_in_chunks_of_whole_sms(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(import_hazy, "CHUNK_INSTRUCTIONS", 1)
    (launch,) = launches(write_v1(tmp_path / "t.pkl"))
    chunks = list(launch.records)
    assert [c.num_rows for c in chunks] == [14, 5]  # SM 0's two instructions stay together
    launch = launch.__class__(**{**launch.__dict__, "records": chunks})
    assert rows(launch) == V1_RECORDS  # stage_task_index carries over chunks


# The throughput branch: globaltimer ns since the CTA's start, low 4 bits an event type.
def throughput_slots(opcode: int, worker: int, values: dict[int, int]) -> dict[int, int]:
    return {0: opcode, 1: worker, **values}


def test_throughput_global_queue_pickle(tmp_path: Path) -> None:
    # [4 instructions, 128]: the worker (SM) in slot 1, task = the global queue index.
    slots = hp.timings(1, 4, {
        (0, 0): throughput_slots(3, 5, {5: 1008, 6: 1216, 7: 3008, 12: 1264, 13: 2002}),
        (0, 1): throughput_slots(4, 2, {5: 512, 6: 528, 8: 544, 9: 800}),
        (0, 3): throughput_slots(3, 5, {5: 3024, 6: 3040, 14: 3056, 15: 3200}),
    })[0]  # fmt: skip
    words = hp.instructions(1, 4, {(0, 0): 3, (0, 1): 4, (0, 3): 3})[0]
    (launch,) = launches(hp.write_pickle(tmp_path / "g.pkl", slots, words))
    assert launch.producer_format == "timings-pickle:throughput"
    assert launch.frequency_hz == 1e9
    assert rows(launch) == [
        # SM 2, queue index 1: 512 .. 800
        (2, 0, 512, 800, 4, 1, 0, NO, "compute"),
        (2, 1, 512, 528, 0x1004, 1, 0, NO, "compute"),
        (2, 2, 544, 800, 0x2004, 1, 0, NO, "compute"),
        # SM 5, queue index 0: 1008 .. 3008 (cleanup, slot 7); 2002 & ~0xF = 2000
        (5, 0, 1008, 3008, 3, 0, 0, NO, "compute"),
        (5, 1, 1008, 1216, 0x1003, 0, 0, NO, "compute"),
        (5, 2, 1264, 2000, 0x4003, 0, 0, NO, "compute"),
        # SM 5, queue index 3: 3024 .. 3200
        (5, 3, 3024, 3200, 3, 3, 1, NO, "compute"),
        (5, 4, 3024, 3040, 0x1003, 3, 1, NO, "compute"),
        (5, 5, 3056, 3200, 0x5003, 3, 0, NO, "compute"),
    ]
    assert launch.owner_label is None


def test_throughput_slot_zero_must_be_the_opcode(tmp_path: Path) -> None:
    slots = hp.timings(1, 1, {(0, 0): throughput_slots(9, 0, {5: 16, 6: 32})})
    words = hp.instructions(1, 1, {(0, 0): 3})
    with pytest.raises(ImportFormatError, match=r"instruction 0: slot 0 \(9\) is not its opcode"):
        decoded(hp.write_pickle(tmp_path / "x.pkl", slots, words))


# .mkprof: two GPUs of two SMs, two instructions per SM.
def mkprof_sample() -> tuple[np.ndarray, np.ndarray]:
    events = np.zeros((4, 2, 128), np.int64)
    events[0, 0, :16] = [3, 0, 0, 0, 0, 1008, 1216, 5008, 1232, 2000, 1248, 1600, 1264,
                         4000 | 2, 4016, 4800]  # fmt: skip
    events[0, 0, 16] = 1296 | 7  # a packed loader WAIT event: not imported
    events[0, 1, [0, 1, 5, 6, 8, 9, 12, 13]] = [5, 0, 2016, 2032, 2048, 2400, 2064, 3008]
    events[2, 0, [0, 1, 5, 6, 7, 12, 13]] = [3, 0, 512, 528, 1024, 544, 1008]
    events[3, 0, [0, 1, 8]] = [3, 1, 600]  # the loader's end unrecorded: no record
    words = np.zeros((4, 2, 32), np.int32)
    words[..., 0] = events[..., 0]
    return events, words


MKPROF_NAMES = {3: "GQA Decode", 5: "O Proj"}


def write_mkprof(path: Path, **options: object) -> Path:
    events, words = mkprof_sample()
    return hp.write_mkprof(path, events, words, names=MKPROF_NAMES, num_gpus=2, **options)


def test_mkprof_one_launch_per_gpu(tmp_path: Path) -> None:
    gpu0, gpu1 = launches(write_mkprof(tmp_path / "p.mkprof"))
    assert rows(gpu0) == [
        # first start 1008 (slot 5), last end 5008 (cleanup, slot 7)
        (0, 0, 1008, 5008, 3, 0, 0, NO, "compute"),
        (0, 1, 1008, 1216, 0x1003, 0, 0, NO, "compute"),
        (0, 2, 1232, 2000, 0x2003, 0, 0, NO, "compute"),
        (0, 3, 1248, 1600, 0x3003, 0, 0, NO, "compute"),
        (0, 4, 1264, 4000, 0x4003, 0, 0, NO, "compute"),  # 4002 & ~0xF
        # instruction 1: no cleanup recorded, last end 3008 (consumer)
        (0, 5, 2016, 3008, 5, 1, 0, NO, "compute"),
        (0, 6, 2016, 2032, 0x1005, 1, 0, NO, "compute"),
        (0, 7, 2048, 2400, 0x2005, 1, 0, NO, "compute"),
        (0, 8, 2064, 3008, 0x4005, 1, 0, NO, "compute"),
        (0, 9, 4016, 4800, 0x5003, 0, 0, NO, "compute"),
    ]
    assert rows(gpu1) == [
        (0, 0, 512, 1024, 3, 0, 0, NO, "compute"),
        (0, 1, 512, 528, 0x1003, 0, 0, NO, "compute"),
        (0, 2, 544, 1008, 0x4003, 0, 0, NO, "compute"),
    ]
    assert (gpu0.rank, gpu0.device, gpu1.rank, gpu1.device) == (0, 0, 1, 1)
    assert gpu0.stage_names[3] == "GQA Decode"
    assert gpu0.stage_names[0x4005] == "O Proj.consumer"
    assert 0 in gpu0.stage_names  # padding instructions are opcode 0, named op_0
    assert (gpu0.frequency_hz, gpu0.clock_domain, gpu0.producer_format) == (
        1e9,
        "per_core",
        "mkprof:1.2",
    )
    assert gpu1.source.endswith("p.mkprof (GPU 1)")


def test_mkprof_truncated(tmp_path: Path) -> None:
    path = write_mkprof(tmp_path / "p.mkprof")
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ImportFormatError, match=r"4 processors x 2 instructions need \d+ bytes, "
                       r"the file has \d+ \(truncated\)"):  # fmt: skip
        decoded(path)


def test_mkprof_header_contradicting_the_arrays(tmp_path: Path) -> None:
    path = write_mkprof(tmp_path / "p.mkprof", header={"max_instructions": 3})
    with pytest.raises(ImportFormatError, match="4 processors x 3 instructions need"):
        decoded(path)
    path = write_mkprof(tmp_path / "q.mkprof", header={"num_gpus": 3})
    with pytest.raises(ImportFormatError, match="4 processors do not split evenly over 3 GPUs"):
        decoded(path)
    path = write_mkprof(tmp_path / "r.mkprof", header={"total_processors": "4"})
    with pytest.raises(ImportFormatError, match="the config's 'total_processors' is '4'"):
        decoded(path)
    path.write_bytes(hp.MAGIC + b'{"num_gpus": 1,')
    with pytest.raises(ImportFormatError, match="the config after the magic line is not JSON"):
        decoded(path)


def test_zero_records_is_an_error(tmp_path: Path) -> None:
    words = hp.instructions(2, 2, {(0, 0): 1})
    path = hp.write_pickle(tmp_path / "z.pkl", hp.timings(2, 2, {}), words)
    with pytest.raises(ImportFormatError, match="no instruction has a recorded timing"):
        decoded(path)
    store = open_store(tmp_path / "store")
    path = hp.write_mkprof(tmp_path / "z.mkprof", np.zeros((2, 2, 128)), np.zeros((2, 2, 32)))
    with pytest.raises(ImportFormatError, match=r"z.mkprof \(GPU 0\): the launch holds no record"):
        import_profile(store, [path], format="hazy")
    assert store.sql("SELECT count(*) AS n FROM invocations")["n"].to_pylist() == [0]


def test_negative_times_name_the_slot(tmp_path: Path) -> None:
    slots = hp.timings(2, 2, {**V1_SLOTS_SMALL, (1, 1): {0: 50, 3: -7}})
    path = hp.write_pickle(tmp_path / "n.pkl", slots, hp.instructions(2, 2, {(1, 1): 1}))
    with pytest.raises(
        ImportFormatError, match="SM 1, instruction 3: slot 3 holds a negative time -7"
    ):
        decoded(path)
    events, words = mkprof_sample()
    events[2, 0, 6] = 0xFFFFFF00  # an int32 -256 written as uint32
    path = hp.write_mkprof(tmp_path / "n.mkprof", events, words, num_gpus=2)
    with pytest.raises(ImportFormatError, match=r"\(GPU 1\): SM 0, instruction 0: slot 6 holds a "
                       "negative time -256"):  # fmt: skip
        decoded(path)


V1_SLOTS_SMALL = {(0, 0): {0: 10, 3: 20, 4: 90}}


def test_backwards_pair_names_sm_instruction_and_slots(tmp_path: Path) -> None:
    slots = hp.timings(2, 2, {**V1_SLOTS_SMALL, (1, 1): {0: 100, 3: 120, 4: 900, 5: 500, 6: 400}})
    path = hp.write_pickle(tmp_path / "b.pkl", slots, hp.instructions(2, 2, {(1, 1): 1}))
    with pytest.raises(ImportFormatError, match=r"SM 1, instruction 3: slot 6 \(400\) ends "
                       r"before slot 5 \(500\) starts"):  # fmt: skip
        decoded(path)
    # the closing slot (controller end) before the instruction's first start
    slots = hp.timings(1, 1, {(0, 0): {0: 100, 3: 120, 4: 90}})
    path = hp.write_pickle(tmp_path / "c.pkl", slots, hp.instructions(1, 1, {(0, 0): 1}))
    with pytest.raises(ImportFormatError, match=r"instruction 0: slot 4 \(90\), which closes it, "
                       r"lies before its first start \(100\)"):  # fmt: skip
        decoded(path)


class _Foreign:
    def __reduce__(self):
        return (print, ("the pickle ran code",))


def test_a_foreign_global_is_refused_before_it_runs(tmp_path: Path, capsys) -> None:
    data = {"timings": np.zeros((1, 1, 128), np.int32), "instructions": _Foreign()}
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(data))
    with pytest.raises(ImportFormatError, match=r"evil.pkl: the pickle names builtins.print"):
        decoded(path)
    assert capsys.readouterr().out == ""


def test_the_producers_objects_are_inert_stand_ins(tmp_path: Path) -> None:
    write_v1(tmp_path / "t.pkl")
    with (tmp_path / "t.pkl").open("rb") as file:
        data = import_hazy._Unpickler(file, "t").load()
    assert "megakernels.demos.latency.instructions" not in sys.modules
    first = data["python_instructions"][0][0]
    assert type(first).__name__ == QKV
    assert type(first).__module__.startswith("megakernels.")
    assert first.state == {"layer_idx": 7, "index": 0}
    assert data["cost_per_sm"] == [1.5, 0.5, 0.0]
    assert data["timings"].dtype == np.int32
    assert data["timings"].shape == (3, 3, 128)


def test_not_a_timings_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{}")
    with pytest.raises(ImportFormatError, match=r"neither a \.mkprof file"):
        decoded(path)
    path.write_bytes(pickle.dumps({"timings": [1, 2]}))
    with pytest.raises(ImportFormatError, match="a dict with 'timings' and 'instructions'"):
        decoded(path)
    path.write_bytes(pickle.dumps({"timings": np.zeros((2, 64)), "instructions": 1}))
    with pytest.raises(ImportFormatError, match=r"'timings' must be an integer array \[..., 128\]"):
        decoded(path)
    words = np.zeros((2, 3, 32), np.int32)
    path.write_bytes(
        pickle.dumps({"timings": np.zeros((2, 2, 128), np.int32), "instructions": words})
    )
    with pytest.raises(ImportFormatError, match="disagree on their SMs and instructions"):
        decoded(path)
    path.write_bytes(pickle.dumps({"timings": 1})[:-4])
    with pytest.raises(ImportFormatError, match="not a readable pickle"):
        decoded(path)


def test_end_to_end_views_and_export(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    imported = import_profile(store, [write_v1(tmp_path / "t.pkl")], format="hazy", run_id="hz")
    assert imported.records == 19
    # ns from the anchor, the earliest start of any SM (100 cycles, SM 1), at 1.8 GHz
    got = store.sql(
        "SELECT block_id, record_index, stage, phase, ts_ns, dur_ns FROM records_ns "
        "WHERE record_index IN (0, 6) ORDER BY block_id, record_index"
    ).to_pylist()
    assert [(r["block_id"], r["record_index"], r["stage"], r["phase"]) for r in got] == [
        (0, 0, QKV, "compute"),
        (0, 6, QKV, "wait"),  # a wait takes its task's stage
        (1, 0, QKV, "compute"),
    ]
    expected = [(120 - 100) / 1.8, 2280 / 1.8, 200 / 1.8, 400 / 1.8, 0.0, 1900 / 1.8]
    assert [v for r in got for v in (r["ts_ns"], r["dur_ns"])] == pytest.approx(expected)
    stats = {r["stage"]: r for r in store.sql("SELECT * FROM stage_stats").to_pylist()}
    assert stats[f"{QKV}.consumer"]["tasks"] == 3  # one record per consumer warp
    assert stats[QKV]["compute_total_us"] == pytest.approx((2280 + 1900) / 1.8e3)
    assert stats[QKV]["wait_p50_us"] == pytest.approx((400 / 1.8 + 700 / 1.8) / 2e3)
    cores = store.sql(
        "SELECT block_id, records, makespan_ns, compute_ns, wait_ns, front_gap_ns, tail_gap_ns "
        "FROM core_breakdown ORDER BY block_id"
    ).to_pylist()
    # Each SM on its own clock: the makespan spans cycle 100 (SM 1) .. 3500 (SM 0), 1889 ns;
    # SM 0's front gap and SM 1's tail gap come from their different CTA epochs. The gmem
    # waits lie inside their instruction's record and add no wait time.
    assert cores == [
        {"block_id": 0, "records": 14, "makespan_ns": 1889, "compute_ns": 1878, "wait_ns": 0,
         "front_gap_ns": 11, "tail_gap_ns": 0},
        {"block_id": 1, "records": 5, "makespan_ns": 1889, "compute_ns": 1056, "wait_ns": 0,
         "front_gap_ns": 0, "tail_gap_ns": 833},
    ]  # fmt: skip
    (invocation,) = store.sql(
        "SELECT clock_domain, producer, producer_format, frequency_hz, anchor_cycle "
        "FROM invocations"
    ).to_pylist()
    assert invocation == {
        "clock_domain": "per_core",
        "producer": "hazy",
        "producer_format": "timings-pickle:v1",
        "frequency_hz": 1.8e9,
        "anchor_cycle": 100,
    }
    export_chrome_trace(store, tmp_path / "t.json", run="hz")
    events = [
        e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e["ph"] == "X"
    ]
    assert len(events) == 19
    waits = [e for e in events if e["args"]["desc_id"] == 0x10000]
    assert [(e["name"], e["args"]["block_id"], e["args"]["start_cycle"]) for e in waits] == [
        (f"{QKV}_WaitDependency", 0, 300),
        (f"{QKV}_WaitDependency", 1, 200),
    ]


def test_synthetic_file_and_numpy_baseline(tmp_path: Path) -> None:
    path = tmp_path / "s.mkprof"
    expected = hp.write_synthetic(path, 5000, processors=4)
    assert expected == 6 * 209 * 4  # ceil(5000 / 24) = 209 instructions per SM
    (launch,) = launches(path)
    table = pa.concat_tables(list(launch.records))
    assert table.num_rows == expected
    baseline = hp.numpy_decode(path)
    loaders = table.filter(
        pa.compute.equal(pa.compute.bit_wise_and(table["desc_id"], 0xF000), 0x2000)
    )
    loaders = loaders.sort_by([("task_id", "ascending")])
    assert loaders["start_cycle"].to_pylist() == baseline["loader_start"].tolist()
    assert loaders["end_cycle"].to_pylist() == baseline["loader_end"].tolist()
    assert sorted(set(baseline["opcode"].tolist())) == [1, 2]


def test_mkprof_import_gives_one_rank_per_gpu(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    imported = import_profile(store, [write_mkprof(tmp_path / "p.mkprof")], format="hazy", rank=4)
    assert imported.records == 13
    got = store.sql(
        "SELECT rank, device, record_count, anchor_cycle, frequency_hz, clock_domain "
        "FROM invocations ORDER BY rank"
    ).to_pylist()
    assert [tuple(r.values()) for r in got] == [
        (4, 0, 10, 1008, 1e9, "per_core"),
        (5, 1, 3, 512, 1e9, "per_core"),
    ]
    (stage,) = store.sql(
        "SELECT stage, tasks, compute_total_us FROM stage_stats WHERE stage = 'GQA Decode'"
    ).to_pylist()
    assert stage == {"stage": "GQA Decode", "tasks": 2, "compute_total_us": (4000 + 512) / 1e3}
