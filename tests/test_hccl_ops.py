"""Per-op communication times from the HCCL task stream: ``hccl_op_times`` (msprof's
"Communication Time Info") and ``hccl_op_bandwidth`` ("Communication Bandwidth Info").

Checked against msprof's own communication.json of the same 2025 ImageNet captures (both
ranks, Level1 and Level2), and on a torch_npu-shaped trace written here with round numbers
for each rule: synchronization, wait, transit, idle, an RDMA payload window, an on-chip copy
left out, a missing plane.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from shared_fixtures import shared_fixture

from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store

US = 1000
"""ns per µs."""
MS = 1_000_000
"""ns per ms."""

TIME_COLUMNS = {
    "Elapse Time(ms)": "elapse_ns",
    "Transit Time(ms)": "transit_ns",
    "Wait Time(ms)": "wait_ns",
    "Synchronization Time(ms)": "sync_ns",
    "Idle Time(ms)": "idle_ns",
}
TRANSPORT_TYPES = ("RDMA", "HCCS", "PCIE", "SDMA", "SIO")

ROUNDED_ELSEWHERE = {
    # (level, rank, op, column): (ours, msprof's). Each task's duration is rounded to the
    # ns here; msprof sums fractional ns, and these values lie that near a 4th-place
    # rounding boundary (rank 1's wait ratio is 0.116449..., msprof's 0.116451...).
    (1, 1, "hcom_allReduce__586_0_1", "wait_ratio"): (0.1164, 0.1165),
    (2, 0, "hcom_allReduce__271_0_1", "HCCS bandwidth_gb_s"): (15.7674, 15.7675),
    (2, 0, "hcom_allReduce__271_0_1", "SDMA bandwidth_gb_s"): (15.7674, 15.7675),
    (2, 1, "hcom_allReduce__271_0_1", "HCCS bandwidth_gb_s"): (15.4908, 15.4909),
    (2, 1, "hcom_allReduce__271_0_1", "SDMA bandwidth_gb_s"): (15.4908, 15.4909),
}
"""The values that cannot equal msprof's (see hccl_ops.sql): ours, and msprof's."""


def rows(store: Store, query: str, params: Any = None) -> list[dict[str, Any]]:
    return store.sql(query, params).to_pylist()


def communication_json(level: int, rank: int) -> dict[str, Any]:
    """msprof's ops of the capture's step 50 by op name (without its @group suffix), but its
    "Total Op Info" sums."""
    path = shared_fixture(
        f"ascend-cluster/msinsight_imagenet_2rank_dp_text/level{level}/rank{rank}_ascend_pt/"
        "ASCEND_PROFILER_OUTPUT/communication.json"
    )
    ops = json.loads(path.read_text())["step50"]["collective"]
    return {name.split("@")[0]: op for name, op in ops.items() if "@" in name}


def ingest_capture(store: Store, level: int, rank: int) -> str:
    trace = f"ascend/torchnpu_imagenet_2025_L{level}_rank{rank}_trace_view.json.gz"
    return ingest_trace(store, shared_fixture(trace)).source_id


@pytest.mark.parametrize(("level", "rank"), [(1, 0), (1, 1), (2, 0), (2, 1)])
def test_op_times_are_msprofs_communication_json(store: Store, level: int, rank: int) -> None:
    expected = communication_json(level, rank)
    ingest_capture(store, level, rank)
    got = rows(store, "SELECT * FROM hccl_op_times ORDER BY start_ns")
    assert [op["op_name"] for op in got] == sorted(expected)
    for op in got:
        info = expected[op["op_name"]]["Communication Time Info"]
        assert (op["step_number"], op["group_name"]) == (50, "Group 0 Communication")
        # msprof's float µs of an epoch time: a double's 0.25 µs steps.
        assert op["start_ns"] / US == pytest.approx(info["Start Timestamp(us)"], abs=0.25)
        for key, column in TIME_COLUMNS.items():
            # Within a ns: msprof sums each task's fractional ns (1/32 ns steps), the store
            # holds each rounded to the ns.
            assert abs(op[column] - info[key] * MS) <= 1, (op["op_name"], column)
        for key, column in (
            ("Wait Time Ratio", "wait_ratio"),
            ("Synchronization Time Ratio", "sync_ratio"),
        ):
            known = ROUNDED_ELSEWHERE.get((level, rank, op["op_name"], column))
            assert (op[column], info[key]) == known if known else op[column] == info[key]


@pytest.mark.parametrize(("level", "rank"), [(1, 0), (1, 1), (2, 0), (2, 1)])
def test_op_bandwidth_is_msprofs_communication_json(store: Store, level: int, rank: int) -> None:
    expected = communication_json(level, rank)
    ingest_capture(store, level, rank)
    got = rows(store, "SELECT * FROM hccl_op_bandwidth")
    assert sorted((op["op_name"], op["transport_type"]) for op in got) == sorted(
        (name, kind) for name in expected for kind in TRANSPORT_TYPES
    )
    for op in got:
        info = expected[op["op_name"]]["Communication Bandwidth Info"][op["transport_type"]]
        assert op["transit_bytes"] == round(info["Transit Size(MB)"] * MS)
        assert op["transit_size_mb"] == pytest.approx(info["Transit Size(MB)"], rel=1e-12)
        # All planes' tasks (14 here): within half a ns of each.
        assert abs(op["transit_ns"] - info["Transit Time(ms)"] * MS) <= 7, op["op_name"]
        column = f"{op['transport_type']} bandwidth_gb_s"
        known = ROUNDED_ELSEWHERE.get((level, rank, op["op_name"], column))
        bandwidth = (op["bandwidth_gb_s"], info["Bandwidth(GB/s)"])
        assert bandwidth == known if known else bandwidth[0] == bandwidth[1]
        assert op["large_packet_ratio"] == info["Large Packet Ratio"]
        distribution = dict(op["size_distribution"])
        assert sorted(distribution) == sorted(
            round(float(size) * MS) for size in info["Size Distribution"]
        )
        for size, (packets, ms) in info["Size Distribution"].items():
            bucket = distribution[round(float(size) * MS)]
            assert bucket["packets"] == packets
            assert abs(bucket["transit_ns"] - ms * MS) <= 7


def test_op_times_of_the_level1_rank0_capture(store: Store) -> None:
    # Our exact ns; the master plane is plane 1 (plane 0 holds the on-chip copies).
    ingest_capture(store, 1, 0)
    got = rows(
        store,
        "SELECT op_name, elapse_ns, transit_ns, wait_ns, sync_ns, idle_ns, wait_ratio, "
        "sync_ratio FROM hccl_op_times ORDER BY start_ns",
    )
    assert [tuple(op.values()) for op in got] == [
        ("hcom_allReduce__586_0_1", 79_089_520, 239_185, 5_646_633, 5_615_692, 73_203_702,
         0.9594, 0.9591),
        ("hcom_allReduce__586_1_1", 2_281_106, 1_228_585, 72_401, 20, 980_120, 0.0557, 0.0),
        ("hcom_allReduce__586_2_1", 2_402_388, 2_059_781, 188_424, 0, 154_183, 0.0838, 0.0),
        ("hcom_allReduce__586_3_1", 22_218_864, 155_803, 33_160, 0, 22_029_901, 0.1755, 0.0),
    ]  # fmt: skip


def test_a_single_plane_is_the_master_plane(store: Store) -> None:
    # The 2024 Level1 capture's HCCL writes one plane (plane 0): its master plane, so each
    # op's HCCS transit time over all planes is its transit time.
    trace = "ascend/torchnpu_imagenet_2024_L1_rank0_trace_view.json.gz"
    ingest_trace(store, shared_fixture(trace))
    got = rows(
        store,
        "SELECT t.op_name, t.elapse_ns, t.transit_ns, t.wait_ns, t.sync_ns, t.idle_ns, "
        "t.wait_ratio, t.sync_ratio, b.transit_ns AS hccs_ns FROM hccl_op_times t "
        "JOIN hccl_op_bandwidth b USING (source_id, event_index) "
        "WHERE b.transport_type = 'HCCS' ORDER BY t.start_ns",
    )
    assert [tuple(op.values()) for op in got] == [
        ("hcom_allReduce__538_0_1", 53_398_483, 354_280, 52_219_420, 49_458_704, 824_783,
         0.9933, 0.9929, 354_280),
        ("hcom_allReduce__538_1_1", 5_820_818, 2_243_455, 2_913_839, 1_379_734, 663_524,
         0.565, 0.3808, 2_243_455),
        ("hcom_allReduce__538_2_1", 9_387_904, 5_493_536, 2_514_287, 792_278, 1_380_081,
         0.314, 0.126, 5_493_536),
        ("hcom_allReduce__538_3_1", 2_180_142, 735_566, 1_344_503, 20, 100_073, 0.6464, 0.0,
         735_566),
    ]  # fmt: skip


def test_a_level0_capture_has_ops_but_no_tasks(store: Store) -> None:
    # Level0 records no plane tasks: each op keeps its own start and duration, and no
    # transit, wait or bandwidth (msprof writes no communication.json for it).
    ingest_trace(store, shared_fixture("ascend/torchnpu_imagenet_2025_L0_rank0_trace_view.json.gz"))
    got = rows(
        store,
        "SELECT op_name, step_number, elapse_ns, transit_ns, wait_ns, sync_ns, idle_ns, "
        "wait_ratio, sync_ratio FROM hccl_op_times ORDER BY start_ns",
    )
    assert [(op["op_name"], op["step_number"], op["elapse_ns"]) for op in got] == [
        ("hcom_allReduce__868_0_1", 50, 72_994_438),
        ("hcom_allReduce__868_1_1", 50, 2_193_584),
        ("hcom_allReduce__868_2_1", 50, 2_489_530),
        ("hcom_allReduce__868_3_1", 50, 7_839_337),
    ]
    assert {
        (op["transit_ns"], op["wait_ns"], op["sync_ns"], op["idle_ns"], op["wait_ratio"],
         op["sync_ratio"])
        for op in got
    } == {(None,) * 6}  # fmt: skip
    assert rows(store, "SELECT * FROM hccl_op_bandwidth") == []


# Hand-built: each rule with round numbers ------------------------------------------------

INVALID_NOTIFY = "18446744073709551615"
"""The notify id of a task that carries none (a payload send, a copy)."""


def task(
    plane: int, name: str, start: int, end: int, *, transport: str = "LOCAL",
    link: str = "INVALID_TYPE", size: int = 0, notify: str = INVALID_NOTIFY,
) -> dict[str, Any]:  # fmt: skip
    """A plane task (times in µs) with its args as torch_npu writes them."""
    args = {
        "notify_id": notify, "task type": name, "src rank": 0, "dst rank": 1,
        "transport type": transport, "size(Byte)": size, "link type": link,
    }  # fmt: skip
    return {"ph": "X", "name": name, "pid": 200, "tid": plane + 1, "ts": start,
            "dur": end - start, "args": args}  # fmt: skip


def copy(plane: int, name: str, start: int, end: int, size: int, link: str) -> dict[str, Any]:
    """An SDMA copy (Memcpy or Reduce_Inline) of size bytes over link."""
    return task(plane, name, start, end, transport="SDMA", link=link, size=size)


def rdma_send(plane: int, start: int, end: int, size: int, notify: str) -> dict[str, Any]:
    """An RDMASend: a payload where it carries no notify."""
    return task(plane, "RDMASend", start, end, transport="RDMA", size=size, notify=notify)


OPS = [
    # (name, start, end) in µs, on the group thread.
    ("hcom_allReduce__1_0_1", 100, 200),
    ("hcom_allReduce__1_1_1", 300, 400),
    ("hcom_allGather__1_2_1", 500, 550),
]
TASKS = [
    # allReduce 1, master plane 1 (planes 0 to 2, no RDMA on plane 0): a wait before any
    # transfer (synchronization), an HCCS copy (transit), a wait, an on-chip reduction and
    # a notify record (neither: idle).
    task(1, "Notify_Wait", 100, 110),
    copy(1, "Memcpy", 110, 130, 2_000_000, "HCCS"),
    task(1, "Notify_Wait", 130, 135),
    copy(1, "Reduce_Inline", 135, 140, 4_000_000, "ON_CHIP"),
    task(1, "Notify_Record", 140, 141, notify="7"),
    copy(0, "Memcpy", 100, 101, 2_000_000, "ON_CHIP"),
    copy(2, "Memcpy", 110, 150, 2_000_000, "HCCS"),
    copy(2, "Memcpy", 150, 190, 40_000_000, "PCIE"),
    # allReduce 2, planes 0 and 2 (plane 1 missing); master plane 0, which holds RDMA: a
    # synchronization wait, a payload window of two payload sends and the 4 tasks after
    # them (a notify send, a wait, a notify send, a wait), [310, 340), then a wait.
    task(0, "Notify_Wait", 300, 310),
    rdma_send(0, 310, 312, 1_000_000, INVALID_NOTIFY),
    rdma_send(0, 312, 314, 1_000_000, INVALID_NOTIFY),
    rdma_send(0, 314, 315, 4, "9"),
    task(0, "Notify_Wait", 315, 330),
    rdma_send(0, 330, 331, 4, "9"),
    task(0, "Notify_Wait", 331, 340),
    task(0, "Notify_Wait", 340, 345),
    # On plane 2, a payload whose window would run past the plane's last task: no window.
    rdma_send(2, 320, 322, 500_000, INVALID_NOTIFY),
    task(2, "Notify_Wait", 322, 324),
    # allGather: planes 0 and 2, no RDMA: its master plane 1 is missing. Payloads marked by
    # "rdma type" too; an HCCS_SW copy counts as HCCS, an invalid link's as SDMA.
    task(0, "Notify_Wait", 500, 505),
    copy(2, "Memcpy", 510, 520, 1_000_000, "HCCS_SW"),
    copy(2, "Reduce_Inline", 520, 525, 500_000, "INVALID_TYPE"),
]


def write_hccl_trace(path: Path) -> Path:
    """A torch_npu-shaped trace: ProfilerStep#7 launches OPS (flows to the HCCL process's
    group thread), whose tasks are TASKS on the threads of planes 0 to 2."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 200, "tid": 0, "args": {"name": "HCCL"}},
        {"ph": "M", "name": "thread_name", "pid": 200, "tid": 0,
         "args": {"name": "Group 0 Communication"}},
        *({"ph": "M", "name": "thread_name", "pid": 200, "tid": plane + 1,
           "args": {"name": f"Plane {plane}"}} for plane in range(3)),
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#7", "pid": 100, "tid": 100,
         "ts": 0, "dur": 50},
    ]  # fmt: skip
    for flow, (name, start, end) in enumerate(OPS, start=1):
        events += [
            {"ph": "s", "cat": "async_npu", "name": "async_npu", "id": flow, "pid": 100,
             "tid": 100, "ts": 10 * flow},
            {"ph": "f", "cat": "async_npu", "name": "async_npu", "id": flow, "bp": "e",
             "pid": 200, "tid": 0, "ts": start},
            {"ph": "X", "name": name, "pid": 200, "tid": 0, "ts": start, "dur": end - start,
             "args": {"connection_id": flow}},
        ]  # fmt: skip
    path.write_text(json.dumps(events + TASKS))
    return path


def test_hand_built_op_times(store: Store, tmp_path: Path) -> None:
    ingest_trace(store, write_hccl_trace(tmp_path / "hccl.json"))
    got = rows(
        store,
        "SELECT op_name, step_index, step_number, group_name, start_ns, elapse_ns, transit_ns, "
        "wait_ns, sync_ns, idle_ns, wait_ratio, sync_ratio FROM hccl_op_times ORDER BY start_ns",
    )
    group = "Group 0 Communication"
    assert got == [
        # Transit the HCCS copy, 20; wait 10 + 5, 10 of it before the copy; idle the rest.
        {"op_name": "hcom_allReduce__1_0_1", "step_index": 0, "step_number": 7,
         "group_name": group, "start_ns": 100 * US, "elapse_ns": 100 * US,
         "transit_ns": 20 * US, "wait_ns": 15 * US, "sync_ns": 10 * US, "idle_ns": 65 * US,
         "wait_ratio": round(15 / 35, 4), "sync_ratio": round(10 / 30, 4)},
        # Transit the payload window [310, 340) (its two waits are in it); wait 10 + 5.
        {"op_name": "hcom_allReduce__1_1_1", "step_index": 0, "step_number": 7,
         "group_name": group, "start_ns": 300 * US, "elapse_ns": 100 * US,
         "transit_ns": 30 * US, "wait_ns": 15 * US, "sync_ns": 10 * US, "idle_ns": 55 * US,
         "wait_ratio": round(15 / 45, 4), "sync_ratio": 0.25},
        # No task on its master plane: no times but its own.
        {"op_name": "hcom_allGather__1_2_1", "step_index": 0, "step_number": 7,
         "group_name": group, "start_ns": 500 * US, "elapse_ns": 50 * US,
         "transit_ns": None, "wait_ns": None, "sync_ns": None, "idle_ns": None,
         "wait_ratio": None, "sync_ratio": None},
    ]  # fmt: skip


def test_hand_built_op_bandwidth(store: Store, tmp_path: Path) -> None:
    ingest_trace(store, write_hccl_trace(tmp_path / "hccl.json"))
    got = {
        (row["op_name"], row["transport_type"]): (
            row["transit_bytes"], row["transit_ns"], row["bandwidth_gb_s"],
            row["large_packet_ratio"], dict(row["size_distribution"]),
        )
        for row in rows(store, "SELECT * FROM hccl_op_bandwidth")
    }  # fmt: skip

    def packets(*buckets: tuple[int, int, int]) -> dict[int, dict[str, int]]:
        return {size: {"packets": n, "transit_ns": us * US} for size, n, us in buckets}

    none = (0, 0, 0.0, 0.0, {})
    assert got == {
        # All planes: the HCCS copies of planes 1 and 2 (2 MB in 20 and 40 µs), the PCIe
        # copy of plane 2 (40 MB in 40 µs, a large packet); plane 0's on-chip copy counts
        # nowhere. SDMA is HCCS + PCIE.
        ("hcom_allReduce__1_0_1", "RDMA"): none,
        ("hcom_allReduce__1_0_1", "HCCS"): (
            4_000_000, 60 * US, round(4_000_000 / 60_000, 4), 0.0, packets((2_000_000, 2, 60))),
        ("hcom_allReduce__1_0_1", "PCIE"): (
            40_000_000, 40 * US, 1000.0, 1.0, packets((40_000_000, 1, 40))),
        ("hcom_allReduce__1_0_1", "SDMA"): (44_000_000, 100 * US, 440.0, 0.0, {}),
        ("hcom_allReduce__1_0_1", "SIO"): none,
        # The payload window, 2 MB in 30 µs (a packet above RDMA's 0.5 MB); plane 2's
        # unclosed payload counts nowhere.
        ("hcom_allReduce__1_1_1", "RDMA"): (
            2_000_000, 30 * US, round(2_000_000 / 30_000, 4), 1.0, packets((2_000_000, 1, 30))),
        ("hcom_allReduce__1_1_1", "HCCS"): none,
        ("hcom_allReduce__1_1_1", "PCIE"): none,
        ("hcom_allReduce__1_1_1", "SDMA"): none,
        ("hcom_allReduce__1_1_1", "SIO"): none,
        # HCCS_SW is HCCS; the copy of an invalid link is SDMA's, in its distribution only.
        ("hcom_allGather__1_2_1", "RDMA"): none,
        ("hcom_allGather__1_2_1", "HCCS"): (
            1_000_000, 10 * US, 100.0, 0.0, packets((1_000_000, 1, 10))),
        ("hcom_allGather__1_2_1", "PCIE"): none,
        ("hcom_allGather__1_2_1", "SDMA"): (
            1_000_000, 10 * US, 100.0, 0.0, packets((500_000, 1, 5))),
        ("hcom_allGather__1_2_1", "SIO"): none,
    }  # fmt: skip


def test_payloads_marked_by_rdma_type(store: Store, tmp_path: Path) -> None:
    # A trace that writes HCCL's "rdma type": a send marked RDMA_SEND_NOTIFY is no payload
    # even without a notify id; one marked RDMA_SEND_PAYLOAD is. A send op's window holds
    # the 2 tasks after its payloads (an all-reduce's 4).
    events = json.loads(write_hccl_trace(tmp_path / "hccl.json").read_text())
    events = [e for e in events if e.get("tid") not in (1, 2, 3) or e["ph"] == "M"]
    for event in events:
        if event.get("name") == "hcom_allReduce__1_1_1":
            event["name"] = "hcom_send__1_1_1"
    marked = [
        task(0, "Notify_Wait", 300, 305),
        rdma_send(0, 305, 306, 4, INVALID_NOTIFY),
        rdma_send(0, 306, 310, 3_000_000, "5"),
        task(0, "Notify_Wait", 310, 320),
        task(0, "Notify_Wait", 320, 322),
        task(0, "Notify_Wait", 322, 324),
    ]
    marked[1]["args"]["rdma type"] = "RDMA_SEND_NOTIFY"
    marked[2]["args"]["rdma type"] = "RDMA_SEND_PAYLOAD"
    (tmp_path / "marked.json").write_text(json.dumps(events + marked))
    ingest_trace(store, tmp_path / "marked.json")
    (got,) = rows(
        store,
        "SELECT transit_ns, wait_ns, sync_ns, idle_ns FROM hccl_op_times "
        "WHERE op_name = 'hcom_send__1_1_1'",
    )
    # The window [306, 322) holds two waits; the waits at 300 (before it) and 322 count.
    assert got == {"transit_ns": 16 * US, "wait_ns": 7 * US, "sync_ns": 5 * US,
                   "idle_ns": 77 * US}  # fmt: skip
