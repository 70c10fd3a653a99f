"""The analysis room's SQL modules, registered with the store's module registry.

Each module is one file under ``analysis/sql/`` (one topic), with the modules it needs
and, for the outer-kernel modules, the tables it materializes. A query that names a view
of a module makes the store install it first (see ``storage/sql_modules.py``).
"""

from __future__ import annotations

from importlib import resources

import duckdb

from multicore_profiler.analysis.clock_offsets import install_clock_offsets
from multicore_profiler.analysis.clock_settings import (
    DEFAULT_CLOCK_TOLERANCE_NS,
    check_clock_tolerance,
    check_correction,
    install_clock_tolerance,
    install_correction,
    no_correction,
)
from multicore_profiler.analysis.critical_path import (
    DEFAULT_TOLERANCE_CYCLES,
    check_tolerance,
    install_tolerance,
)
from multicore_profiler.analysis.outer_kernel_rules import (
    RULES_NAMES,
    OuterKernelRules,
    check_setting,
    install_setting,
)
from multicore_profiler.storage.sql_modules import Setting, SqlModule, register


def mark_clock_offsets(con: duckdb.DuckDBPyConnection) -> None:
    """Set ``_clock_offsets_present()`` on ``con`` to whether an invocation it sees has
    per-core clock offsets (an anchored import, or an applied clock correction): a constant
    DuckDB prunes by."""
    present = con.execute(
        "SELECT (SELECT count(*) FROM raw_invocations WHERE clock_domain = 'anchored') > 0 "
        "OR (SELECT count(*) FROM _clock_corrections) > 0"
    ).fetchone()
    flag = "true" if present is not None and present[0] else "false"
    con.execute(f"CREATE OR REPLACE TEMP MACRO _clock_offsets_present() AS {flag}")


def _sql(path: str) -> str:
    """The text of one file under ``analysis/sql/``."""
    return resources.files(__package__).joinpath("sql", path).read_text()


# Record analyses: the MegaKernel's records in ns, named, summarized, and its task DAG.
register(
    SqlModule("units", _sql("units.sql")),
    SqlModule("records.names", _sql("records/names.sql")),
    SqlModule(
        "clock_correction",
        setting=Setting(
            default=no_correction, check=check_correction, install=install_correction, eager=True
        ),
        defines=("_clock_corrections",),
    ),
    SqlModule(
        "records.aligned_records",
        _sql("records/aligned_records.sql"),
        needs=("clock_correction",),
        per_cursor=mark_clock_offsets,
    ),
    SqlModule(
        "records.records_ns",
        _sql("records/records_ns.sql"),
        needs=("units", "records.names", "records.aligned_records"),
    ),
    SqlModule(
        "records.stage_stats",
        _sql("records/stage_stats.sql"),
        needs=("records.records_ns", "records.names"),
    ),
    SqlModule("records.run_summary", _sql("records/run_summary.sql")),
    SqlModule(
        "records.task_edges", _sql("records/task_edges.sql"), needs=("records.aligned_records",)
    ),
    # The analyses' views take milliseconds to create: they wait for a query naming them.
    SqlModule(
        "records.core_breakdown",
        _sql("records/core_breakdown.sql"),
        needs=("units", "records.names", "records.aligned_records"),
        on_demand=True,
    ),
    SqlModule(
        "records.wait_attribution",
        _sql("records/wait_attribution.sql"),
        needs=("units", "records.names", "records.records_ns", "records.task_edges"),
        on_demand=True,
    ),
    SqlModule(
        "records.replay_records",
        _sql("records/replay_records.sql"),
        needs=("records.records_ns",),
        on_demand=True,
    ),
    SqlModule(
        "critical_path_tolerance",
        setting=Setting(
            default=lambda: DEFAULT_TOLERANCE_CYCLES,
            check=check_tolerance,
            install=install_tolerance,
        ),
        defines=("critical_path_tolerance_cycles",),
    ),
    SqlModule(
        "records.critical_path",
        _sql("records/critical_path.sql"),
        needs=(
            "units",
            "records.names",
            "records.records_ns",
            "records.task_edges",
            "critical_path_tolerance",
        ),
    ),
    SqlModule(
        "records.kernel_ranks",
        _sql("records/kernel_ranks.sql"),
        needs=("records.critical_path",),
        on_demand=True,
    ),
)

# Clock and schedule sanity: what the records' own causality, the host's launch times and
# the planned queues say of the cores' clocks (docs/clocks.md).
register(
    SqlModule(
        "clock_tolerance",
        setting=Setting(
            default=lambda: DEFAULT_CLOCK_TOLERANCE_NS,
            check=check_clock_tolerance,
            install=install_clock_tolerance,
        ),
        defines=("clock_tolerance_ns",),
    ),
    SqlModule(
        "records.clock_sanity",
        _sql("records/clock_sanity.sql"),
        needs=("units", "records.names", "records.task_edges", "clock_tolerance"),
        on_demand=True,
    ),
    SqlModule(
        "records.clock_offsets",
        needs=("units", "records.clock_sanity"),
        defines=("clock_offsets",),
        computed=install_clock_offsets,
    ),
    SqlModule(
        "records.clock_frequency",
        _sql("records/clock_frequency.sql"),
        needs=("units", "records.aligned_records"),
        on_demand=True,
    ),
    SqlModule(
        "records.schedule_sanity",
        _sql("records/schedule_sanity.sql"),
        needs=("records.names",),
        on_demand=True,
    ),
    SqlModule(
        "records.clock_check",
        _sql("records/clock_check.sql"),
        needs=("records.clock_sanity", "records.clock_frequency", "records.schedule_sanity"),
        on_demand=True,
    ),
)

# Outer-kernel analyses: the rules (a setting per store), then one module per topic. The
# materialized tables are built in this order: device_ops, op_launches, step_periods,
# kernels, step_islands, hccl_op_times; each again when the committed traces change.
_TRACES_COMMITTED = "SELECT source_id, write_id FROM trace_sources ORDER BY ALL"
register(
    SqlModule(
        "outer_kernel_rules",
        setting=Setting(default=OuterKernelRules, check=check_setting, install=install_setting),
        defines=RULES_NAMES,
    ),
    SqlModule(
        "outer_kernels.device_ops",
        _sql("outer_kernels/device_ops.sql"),
        needs=("outer_kernel_rules",),
        materialized=("device_ops", "op_launches"),
        freshness=_TRACES_COMMITTED,
    ),
    SqlModule(
        "outer_kernels.steps",
        _sql("outer_kernels/steps.sql"),
        needs=("outer_kernel_rules", "outer_kernels.device_ops"),
        materialized=("step_periods", "kernels", "step_islands"),
        freshness=_TRACES_COMMITTED,
    ),
    SqlModule(
        "outer_kernels.collectives",
        _sql("outer_kernels/collectives.sql"),
        needs=("outer_kernel_rules", "outer_kernels.steps"),
    ),
    SqlModule(
        "outer_kernels.layers",
        _sql("outer_kernels/layers.sql"),
        needs=("outer_kernel_rules", "outer_kernels.steps"),
    ),
    SqlModule(
        "outer_kernels.step_pairs",
        _sql("outer_kernels/step_pairs.sql"),
        needs=("outer_kernels.steps", "outer_kernels.collectives"),
    ),
    SqlModule(
        "outer_kernels.breakdown",
        _sql("outer_kernels/breakdown.sql"),
        needs=("outer_kernel_rules", "outer_kernels.steps"),
    ),
    SqlModule(
        "outer_kernels.hccl_ops",
        _sql("outer_kernels/hccl_ops.sql"),
        needs=("outer_kernels.device_ops", "outer_kernels.steps"),
        materialized=("hccl_op_times",),
        freshness=_TRACES_COMMITTED,
    ),
    SqlModule(
        "outer_kernels.overlap",
        _sql("outer_kernels/overlap.sql"),
        needs=("outer_kernel_rules", "outer_kernels.steps", "outer_kernels.breakdown"),
    ),
)

# Cross-rank analyses: the ranks of one job side by side, each waiting for a query naming it.
# Their materialized tables (each source's JSON parsed, the steps and parallel layout of
# each rank, the collective instances) are built on install and again when the committed
# traces change.
register(
    SqlModule(
        "cross_rank.steps",
        _sql("cross_rank/steps.sql"),
        needs=("outer_kernels.steps", "outer_kernels.breakdown"),
        materialized=(
            "job_sources",
            "rank_steps",
            "job_groups",
            "pipeline_chains",
            "job_stages",
            "rank_parallel_indices",
        ),
        freshness=_TRACES_COMMITTED,
    ),
    SqlModule(
        "cross_rank.communication",
        _sql("cross_rank/communication.sql"),
        needs=(
            "outer_kernels.steps",
            "outer_kernels.collectives",
            "outer_kernels.hccl_ops",
            "cross_rank.steps",
        ),
        materialized=("collective_instances",),
        freshness=_TRACES_COMMITTED,
    ),
    SqlModule(
        "cross_rank.bandwidth",
        _sql("cross_rank/bandwidth.sql"),
        needs=("outer_kernels.hccl_ops", "cross_rank.steps"),
        on_demand=True,
    ),
    SqlModule(
        "cross_rank.stragglers",
        _sql("cross_rank/stragglers.sql"),
        needs=("cross_rank.steps", "cross_rank.communication"),
        on_demand=True,
    ),
)
