"""``communication_bandwidth``: msprof's "Communication Bandwidth Info" for every rank of a
job, computed from the trace's HCCL tasks (traced ranks) or read from msprof's own
communication.json (ranks without a trace), and the two agreeing on the same captures."""

from __future__ import annotations

import pytest
from shared_fixtures import shared_fixture

from multicore_profiler.ingest.jobs import ingest_job
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store

QWEN3 = "ascend-cluster/msinsight_st_qwen3_4rank_pp2_dp2"
TEXT = "ascend-cluster/msinsight_imagenet_2rank_dp_text/level{}"
TRACE = "ascend/torchnpu_imagenet_2025_L{}_rank{}_trace_view.json.gz"
COLUMNS = (
    "rank, step, group_name, op_name, transport_type, transit_bytes, transit_ns, "
    "bandwidth_gb_s, large_packet_ratio, size_distribution, basis"
)


def rows(store: Store, job: str) -> list[dict]:
    return store.sql(
        f"SELECT {COLUMNS} FROM communication_bandwidth WHERE job_id = $1 ORDER BY ALL", [job]
    ).to_pylist()


def test_msprofs_rows_of_a_simplified_export(store: Store) -> None:
    ingest_job(store, [shared_fixture(QWEN3)], job="qwen3")
    got = [r for r in rows(store, "qwen3") if r["rank"] == 0 and r["transport_type"] == "HCCS"]
    (scatter,) = [r for r in got if r["op_name"] == "hcom_reduceScatter__097_4_1"]
    # communication.json: Transit Size 440.46643200000005 MB, Time 23.5656 ms, 18.6911 GB/s,
    # Large Packet Ratio 1.0, Size Distribution {"125.82912": [3, 20.19634],
    # "62.979072": [1, 3.36926]}.
    assert scatter == {
        "rank": 0, "step": 13, "group_name": "5862276114690318097",
        "op_name": "hcom_reduceScatter__097_4_1", "transport_type": "HCCS",
        "transit_bytes": 440_466_432, "transit_ns": 23_565_600, "bandwidth_gb_s": 18.6911,
        "large_packet_ratio": 1.0,
        "size_distribution": [
            (62_979_072, {"packets": 1, "transit_ns": 3_369_260}),
            (125_829_120, {"packets": 3, "transit_ns": 20_196_340}),
        ],
        "basis": "msprof",
    }  # fmt: skip
    transports = {r["transport_type"] for r in rows(store, "qwen3")}
    assert transports == {"RDMA", "HCCS", "PCIE", "SDMA", "SIO"}


@pytest.mark.parametrize("level", [1, 2])
def test_the_traced_ranks_equal_their_own_communication_json(store: Store, level: int) -> None:
    ingest_job(
        store,
        [shared_fixture(TEXT.format(level)) / f"rank{r}_ascend_pt" for r in (0, 1)],
        job="msprof",
    )
    for rank in (0, 1):
        ingest_trace(store, shared_fixture(TRACE.format(level, rank)), rank=rank, job="trace")
    ours, theirs = rows(store, "trace"), rows(store, "msprof")
    assert len(ours) == len(theirs) == 2 * 4 * 5  # ranks x ops x transports
    for mine, msprof in zip(ours, theirs, strict=True):
        same = ("rank", "step", "op_name", "transport_type", "transit_bytes")
        assert {k: mine[k] for k in same} == {k: msprof[k] for k in same}
        # The trace's task durations are rounded to the ns; msprof sums fractions of one.
        assert abs(mine["transit_ns"] - msprof["transit_ns"]) <= 5, mine
        assert mine["bandwidth_gb_s"] == pytest.approx(msprof["bandwidth_gb_s"], abs=1e-4)
        assert mine["large_packet_ratio"] == msprof["large_packet_ratio"]
        # msprof leaves SDMA's distribution empty; the others hold the same packets.
        if mine["transport_type"] != "SDMA":
            assert [(size, d["packets"]) for size, d in mine["size_distribution"]] == [
                (size, d["packets"]) for size, d in msprof["size_distribution"]
            ]
    assert {r["basis"] for r in ours} == {"trace"}
