"""The comparison renderers: Markdown for a pull-request comment, the JSON document and the
terminal's table, exactly, on a comparison of outer traces and on one with missing sides."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from test_kernels import write_moe_trace

from multicore_profiler.analysis.compare import Comparison
from multicore_profiler.export.compare_text import (
    comparison_json,
    comparison_markdown,
    comparison_table,
)
from multicore_profiler.ingest.outer_trace import ingest_trace
from multicore_profiler.storage.store import Store


def trace_comparison(store: Store, tmp_path) -> Comparison:
    """Twelve steps of the MoE trace, old and new; the new all-reduce is 7 us slower."""
    names = [f"ProfilerStep#{n}" for n in range(12)]
    old = write_moe_trace(tmp_path / "old.json", rank=0, names=names)
    new = write_moe_trace(tmp_path / "new.json", rank=0, names=names, all_reduce_extra_us=7)
    ingest_trace(store, old, label="old")
    ingest_trace(store, new, label="new")
    return store.compare("label:old", "label:new", level="kernels", by=("name",))


def test_markdown_of_a_trace_comparison(store: Store, tmp_path) -> None:
    comparison = trace_comparison(store, tmp_path)
    assert comparison_markdown(comparison) == (
        "**mcprof compare**: 1 regressed, 6 unchanged (change of the median above 5%, "
        "Mann-Whitney p < 0.01)\n"
        "\n"
        "base `label:old` (1 run(s)), head `label:new` (1 run(s))\n"
        "\n"
        "| name | base median (us) | head median (us) | change | interval | p | verdict "
        "| added (us/invocation) |\n"
        "|---|---|---|---|---|---|---|---|\n"
        "| ncclDevKernel_AllReduce_Sum_bf16_RING_LL | 20.00 | 27.00 | +35.0% "
        "| +35.0% .. +35.0% | 1.9e-06 | **regressed** | 84.00 |\n"
        "| act_and_mul_kernel | 4.00 | 4.00 | +0.0% | +0.0% .. +0.0% | 1 | unchanged | 0.00 |\n"
        "| flash_fwd_kernel | 45.00 | 45.00 | +0.0% | -20.0% .. +25.0% | 1 | unchanged "
        "| 0.00 |\n"
        "| fused_moe_kernel | 22.50 | 22.50 | +0.0% | -20.0% .. +25.0% | 1 | unchanged "
        "| 0.00 |\n"
        "| moe_router_gemm | 10.00 | 10.00 | +0.0% | +0.0% .. +0.0% | 1 | unchanged | 0.00 |\n"
        "| ncclDevKernel_AllGather_RING_LL | 30.00 | 30.00 | +0.0% | +0.0% .. +0.0% | 1 "
        "| unchanged | 0.00 |\n"
        "| topkGatingSoftmax | 5.00 | 5.00 | +0.0% | +0.0% .. +0.0% | 1 | unchanged | 0.00 |\n"
    )


def test_json_of_a_trace_comparison(store: Store, tmp_path) -> None:
    comparison = trace_comparison(store, tmp_path)
    text = comparison_json(comparison)
    assert text.endswith(b"}\n")
    assert text.startswith(b'{\n  "base": {\n    "selector": "label:old",\n')
    document = json.loads(text)
    assert document["base"] == {"selector": "label:old", "runs": list(comparison.base_ids)}
    assert document["head"] == {"selector": "label:new", "runs": list(comparison.head_ids)}
    assert len(comparison.base_ids) == len(comparison.head_ids) == 1
    assert {key: document[key] for key in ("by", "metric", "threshold", "alpha")} == {
        "by": ["name"],
        "metric": "duration",
        "threshold": 0.05,
        "alpha": 0.01,
    }
    assert document["counts"] == {
        "regressed": 1,
        "improved": 0,
        "unchanged": 6,
        "new": 0,
        "gone": 0,
    }
    assert document["warnings"] == []
    assert document["groups"] == comparison.rows.to_pylist()
    assert {k: v for k, v in document["groups"][0].items() if k != "p_value"} == {
        "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "base_count": 12,
        "head_count": 12,
        "base_median_ns": 20000.0,
        "head_median_ns": 27000.0,
        "base_p90_ns": 20000.0,
        "head_p90_ns": 27000.0,
        "change": 27000 / 20000 - 1,
        "change_low": 27000 / 20000 - 1,
        "change_high": 27000 / 20000 - 1,
        "verdict": "regressed",
        "impact_ns": 84000.0,
    }


def sided_comparison() -> Comparison:
    """A hand-made comparison: a group slower, one new, one gone, one without a change
    (its base median is zero), and a warning."""
    rows = pa.table(
        {
            "stage": ["GMM1", "Combine", "Dispatch", "Wait"],
            "base_count": [4, 0, 3, 2],
            "head_count": [4, 2, 0, 2],
            "base_median_ns": [1000.0, None, 2500.0, 0.0],
            "head_median_ns": [1500.0, 750.0, None, 10.0],
            "base_p90_ns": [1100.0, None, 2600.0, 0.0],
            "head_p90_ns": [1600.0, 800.0, None, 12.0],
            "change": [0.5, None, None, None],
            "change_low": [0.25, None, None, None],
            "change_high": [0.75, None, None, None],
            "p_value": [0.0284, None, None, 0.5],
            "verdict": ["regressed", "new", "gone", "unchanged"],
            "impact_ns": [2000.0, 750.0, -3750.0, 10.0],
        }
    )
    return Comparison(
        rows=rows,
        base_ids=("run-a",),
        head_ids=("run-b", "run-c"),
        base="commit:aaaa",
        head="commit:bbbb",
        by=("stage",),
        level="records",
        metric="duration",
        threshold=0.1,
        alpha=0.05,
        warnings=("base and head differ in SoC: base Ascend910B4; head Ascend910B3",),
        samples={("GMM1",): {False: np.array([1000.0]), True: np.array([1500.0])}},
    )


def test_missing_sides_and_statistics_are_empty_cells() -> None:
    assert comparison_markdown(sided_comparison()) == (
        "**mcprof compare**: 1 regressed, 1 unchanged, 1 new, 1 gone (change of the median "
        "above 10%, Mann-Whitney p < 0.05)\n"
        "\n"
        "base `commit:aaaa` (1 run(s)), head `commit:bbbb` (2 run(s))\n"
        "\n"
        "> warning: base and head differ in SoC: base Ascend910B4; head Ascend910B3\n"
        "| stage | base median (us) | head median (us) | change | interval | p | verdict "
        "| added (us/invocation) |\n"
        "|---|---|---|---|---|---|---|---|\n"
        "| GMM1 | 1.00 | 1.50 | +50.0% | +25.0% .. +75.0% | 0.028 | **regressed** | 2.00 |\n"
        "| Combine |  | 0.75 |  |  |  | new | 0.75 |\n"
        "| Dispatch | 2.50 |  |  |  |  | gone | -3.75 |\n"
        "| Wait | 0.00 | 0.01 |  |  | 0.5 | unchanged | 0.01 |\n"
    )


def test_json_of_missing_sides_is_null() -> None:
    assert comparison_json(sided_comparison()) == (
        b"{\n"
        b'  "base": {\n    "selector": "commit:aaaa",\n    "runs": [\n      "run-a"\n    ]\n  },\n'
        b'  "head": {\n    "selector": "commit:bbbb",\n    "runs": [\n      "run-b",\n'
        b'      "run-c"\n    ]\n  },\n'
        b'  "by": [\n    "stage"\n  ],\n'
        b'  "metric": "duration",\n'
        b'  "threshold": 0.1,\n'
        b'  "alpha": 0.05,\n'
        b'  "counts": {\n    "regressed": 1,\n    "improved": 0,\n    "unchanged": 1,\n'
        b'    "new": 1,\n    "gone": 1\n  },\n'
        b'  "warnings": [\n'
        b'    "base and head differ in SoC: base Ascend910B4; head Ascend910B3"\n  ],\n'
        b'  "groups": [\n'
        b'    {\n      "stage": "GMM1",\n      "base_count": 4,\n      "head_count": 4,\n'
        b'      "base_median_ns": 1000.0,\n      "head_median_ns": 1500.0,\n'
        b'      "base_p90_ns": 1100.0,\n      "head_p90_ns": 1600.0,\n      "change": 0.5,\n'
        b'      "change_low": 0.25,\n      "change_high": 0.75,\n      "p_value": 0.0284,\n'
        b'      "verdict": "regressed",\n      "impact_ns": 2000.0\n    },\n'
        b'    {\n      "stage": "Combine",\n      "base_count": 0,\n      "head_count": 2,\n'
        b'      "base_median_ns": null,\n      "head_median_ns": 750.0,\n'
        b'      "base_p90_ns": null,\n      "head_p90_ns": 800.0,\n      "change": null,\n'
        b'      "change_low": null,\n      "change_high": null,\n      "p_value": null,\n'
        b'      "verdict": "new",\n      "impact_ns": 750.0\n    },\n'
        b'    {\n      "stage": "Dispatch",\n      "base_count": 3,\n      "head_count": 0,\n'
        b'      "base_median_ns": 2500.0,\n      "head_median_ns": null,\n'
        b'      "base_p90_ns": 2600.0,\n      "head_p90_ns": null,\n      "change": null,\n'
        b'      "change_low": null,\n      "change_high": null,\n      "p_value": null,\n'
        b'      "verdict": "gone",\n      "impact_ns": -3750.0\n    },\n'
        b'    {\n      "stage": "Wait",\n      "base_count": 2,\n      "head_count": 2,\n'
        b'      "base_median_ns": 0.0,\n      "head_median_ns": 10.0,\n'
        b'      "base_p90_ns": 0.0,\n      "head_p90_ns": 12.0,\n      "change": null,\n'
        b'      "change_low": null,\n      "change_high": null,\n      "p_value": 0.5,\n'
        b'      "verdict": "unchanged",\n      "impact_ns": 10.0\n    }\n'
        b"  ]\n"
        b"}\n"
    )


def test_the_terminal_table_in_microseconds_and_percent() -> None:
    assert comparison_table(sided_comparison()).to_pylist() == [
        {
            "stage": "GMM1",
            "base_n": 4,
            "head_n": 4,
            "base_us": 1.0,
            "head_us": 1.5,
            "change": "+50.0%",
            "interval": "+25.0% .. +75.0%",
            "p": "0.028",
            "verdict": "regressed",
            "added_us_per_invocation": 2.0,
        },
        {
            "stage": "Combine",
            "base_n": 0,
            "head_n": 2,
            "base_us": None,
            "head_us": 0.75,
            "change": None,
            "interval": None,
            "p": None,
            "verdict": "new",
            "added_us_per_invocation": 0.75,
        },
        {
            "stage": "Dispatch",
            "base_n": 3,
            "head_n": 0,
            "base_us": 2.5,
            "head_us": None,
            "change": None,
            "interval": None,
            "p": None,
            "verdict": "gone",
            "added_us_per_invocation": -3.75,
        },
        {
            "stage": "Wait",
            "base_n": 2,
            "head_n": 2,
            "base_us": 0.0,
            "head_us": 0.01,
            "change": None,
            "interval": None,
            "p": "0.5",
            "verdict": "unchanged",
            "added_us_per_invocation": 0.01,
        },
    ]
