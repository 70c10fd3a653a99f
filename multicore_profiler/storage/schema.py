"""Arrow schemas of the store's tables, and how each is partitioned and encoded.

Partition columns (``run_id``, ``step``) live in the directory names, not in the
files, so that DuckDB and Spark read the same hive layout without duplicate columns;
only a cores or records file of several steps (``GROUPED``) holds ``step`` itself.
Raw cycles and ids are kept exactly as the device wrote them.

``write_id`` is drawn afresh for every step a writer stores and stamped on its
invocations, cores and records: rows join their invocation by (run, rank,
invocation id, write id), so the leftovers of a writer that died mid-step never join
the invocations a retry writes under the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa

_TIME = pa.timestamp("us", tz="UTC")
_STRING_MAP = pa.map_(pa.string(), pa.string())


@dataclass(frozen=True)
class TableSpec:
    """One store table: its file schema, partition keys and Parquet encodings."""

    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    delta_columns: tuple[str, ...] = ()
    """Integer columns of small steps (cycles, ids), written with DELTA_BINARY_PACKED."""
    dictionary_columns: tuple[str, ...] = ()
    """Columns of a few repeated values, dictionary-encoded (and without statistics).
    Every other column is written plain: with snappy that is both the fastest and, for
    runs of equal values, about as small."""
    sort_by: tuple[str, ...] = ()
    """Order of rows in a compacted file of a table merged in memory (runs, invocations);
    cores and records files are streamed in the order of their invocations instead."""
    row_group_rows: int = 1 << 20
    """Rows gathered into one Parquet row group (fewer for tables of long text)."""

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column a query sees: partition keys first, then the file's columns."""
        return self.partition_by + tuple(self.schema.names)


RUNS = TableSpec(
    name="runs",
    schema=pa.schema(
        [
            ("updated_at", _TIME),
            ("start_time", _TIME),
            ("end_time", _TIME),
            ("status", pa.string()),
            ("commit", pa.string()),
            ("branch", pa.string()),
            ("label", pa.string()),
            ("host", pa.string()),
            ("versions", _STRING_MAP),
            ("schedule", pa.string()),
            ("tags", _STRING_MAP),
            ("rank", pa.int32()),
            ("capture_steps", pa.int64()),
            ("capture_job_seconds", pa.float64()),
            ("capture_writer_cpu_seconds", pa.float64()),
            ("capture_writer", pa.string()),
        ]
    ),
    partition_by=("run_id",),
    sort_by=("updated_at",),
)

INVOCATIONS = TableSpec(
    name="invocations",
    schema=pa.schema(
        [
            ("rank", pa.int32()),
            ("device", pa.int32()),
            ("step", pa.int64()),
            ("invocation_id", pa.int64()),
            ("write_id", pa.int64()),
            ("direction", pa.string()),
            ("kernel_name", pa.string()),
            ("soc", pa.string()),
            ("frequency_hz", pa.float64()),
            ("frequency_source", pa.string()),
            ("anchor_cycle", pa.uint64()),
            ("aic_slots", pa.uint32()),
            ("aiv_slots", pa.uint32()),
            ("aic_capacity", pa.uint32()),
            ("aiv_capacity", pa.uint32()),
            ("record_count", pa.int64()),
            ("dropped_count", pa.int64()),
            ("owner_label", pa.string()),
            ("stage_names", pa.map_(pa.uint32(), pa.string())),
            ("window_id", pa.int64()),
            ("config_id", pa.string()),
            ("origin_write_id", pa.int64()),
            ("partial_slots", pa.list_(pa.uint32())),
            ("abi_generation", pa.string()),
            ("producer", pa.string()),
            ("producer_format", pa.string()),
            ("clock_domain", pa.string()),
            ("host_launch_ns", pa.int64()),
            ("host_sync_ns", pa.int64()),
        ]
    ),
    partition_by=("run_id",),
    dictionary_columns=(
        "direction",
        "kernel_name",
        "soc",
        "frequency_source",
        "owner_label",
        "config_id",
        "abi_generation",
        "producer",
        "producer_format",
        "clock_domain",
    ),
    sort_by=("rank", "invocation_id"),
)
"""One row per kernel launch. ``origin_write_id`` is null in a row as its writer wrote
it; a compaction of a remote store rewrites the row under a fresh ``write_id`` and
keeps the write it came from there (see ``DISCARDS``). ``partial_slots`` lists the
slots (indices in the buffer, as ``cores.slot``) that count dropped records although
they are not full: the decoder keeps their records as written (a recorder that
reserves a task's records together drops them all when they do not fit). It is empty
where no slot does, and null in rows written before the column existed.
``abi_generation`` is the device ABI generation that wrote the buffer (``a`` or ``b``,
see ``abi.GENERATIONS``); null in rows written before the column existed, which were all
generation ``a``.
``producer`` names the profiler whose data an import read (``proton``, ``flashinfer``,
``mpk``, ``triton-distributed``, ``hazy``, ``simpler``) and ``producer_format`` the artefact
and its version (``host-buffer/1``, ``chrome-trace``, ...); both are null for mcprof's own
records. ``clock_domain`` says whether the cycles of different cores are comparable:
``shared`` (one counter for the whole device: hyper-parallel's and mcprof's own, read as
such where null), ``anchored`` (a counter per core, each placed on a common clock by an
anchor: ``cores.clock_offset_cycles``) or ``per_core`` (a counter per core and no anchor:
times of different cores cannot be compared).
``host_launch_ns`` and ``host_sync_ns`` are the host's monotonic clock (ns) just before the
launch and once the host knew the kernel had finished (its synchronize returned, or the
launch itself returned for a backend whose kernels run inside their launch): the kernel
ran between them, which bounds its counter's frequency (``clock_frequency``). Null where
no capture session timed the launch (buffers ingested from files, imports, rows written
before the columns existed)."""

CORES = TableSpec(
    name="cores",
    schema=pa.schema(
        [
            ("rank", pa.int32()),
            ("invocation_id", pa.int64()),
            ("write_id", pa.int64()),
            ("slot", pa.uint32()),
            ("core_type", pa.uint8()),
            ("block_id", pa.uint32()),
            ("entry_cycle", pa.uint64()),
            ("record_count", pa.uint32()),
            ("dropped_count", pa.uint32()),
            ("record_capacity", pa.uint32()),
            ("clock_offset_cycles", pa.int64()),
            ("clock_low_cycles", pa.int64()),
            ("clock_high_cycles", pa.int64()),
        ]
    ),
    partition_by=("run_id", "step"),
)
"""One row per slot that recorded (or, for an import, per core that did). The clock
columns are null but for a core of an ``anchored`` invocation: ``clock_offset_cycles`` is
added to the core's raw cycles to place them on the invocation's common clock (chosen by
its producer; every shifted cycle is >= 0), and the anchor allows any offset from
``clock_low_cycles`` to ``clock_high_cycles`` (null on a side it leaves open)."""

CLOCK_COLUMNS = ("clock_offset_cycles", "clock_low_cycles", "clock_high_cycles")
"""The columns of ``cores`` that place an ``anchored`` core's own clock on a common one."""

WIDENED = {("records", "record_index"): pa.uint16()}
"""Columns whose type was widened, with the type older files hold: a generation b slot
holds up to 134,217,712 records, so ``records.record_index`` became ``uint32`` (it was
``uint16`` while a slot held at most 256). An older file reads as the wider type."""

RECORDS = TableSpec(
    name="records",
    schema=pa.schema(
        [
            ("rank", pa.int32()),
            ("invocation_id", pa.int64()),
            ("write_id", pa.int64()),
            ("core_type", pa.uint8()),
            ("block_id", pa.uint32()),
            ("record_index", pa.uint32()),
            ("start_cycle", pa.uint64()),
            ("end_cycle", pa.uint64()),
            ("desc_id", pa.uint32()),
            ("task_id", pa.uint32()),
            ("stage_task_index", pa.uint32()),
            ("owner_id", pa.uint32()),
            ("phase", pa.dictionary(pa.int8(), pa.string())),
        ]
    ),
    partition_by=("run_id", "step"),
    delta_columns=("start_cycle", "end_cycle", "task_id", "stage_task_index", "owner_id"),
    dictionary_columns=("phase",),
)

TASKS = TableSpec(
    name="tasks",
    schema=pa.schema(
        [
            ("rank", pa.int32()),
            ("config_id", pa.string()),
            ("kernel_name", pa.string()),
            ("task_id", pa.uint32()),
            ("task_type", pa.uint32()),
            ("desc_id", pa.uint32()),
            ("stage_task_index", pa.uint32()),
            ("owner_id", pa.uint32()),
            ("core_type", pa.uint8()),
            ("worker", pa.uint32()),
            ("wait_event", pa.int32()),
            ("wait_count", pa.uint32()),
            ("trigger_event", pa.int32()),
            ("tiling_position", pa.uint32()),
            ("input_position", pa.uint32()),
            ("depends_on", pa.list_(pa.uint32())),
        ]
    ),
    partition_by=("run_id",),
    dictionary_columns=("config_id", "kernel_name"),
    sort_by=("rank", "config_id", "task_id"),
)
"""A kernel's task graph, once per (run, rank, config): what invocations with that
``config_id`` ran. ``desc_id`` is what the task's compute record carries (its stage id,
else the 0x20000 + task type fallback); a wait or trigger event of -1 is none.
``depends_on`` lists the task ids a task depends on as an imported producer recorded them
(simpler's dependency edges; empty for a root): such a graph has no wait or trigger
records and its edges are ``dependency`` edges of ``task_edges``. NULL for mcprof's own
graphs, and in files written before the column."""

DISCARDS = TableSpec(
    name="discards",
    schema=pa.schema(
        [
            ("rank", pa.int32()),
            ("write_id", pa.int64()),
            ("window_id", pa.int64()),
            ("discarded_at", _TIME),
            ("reason", pa.string()),
            ("replaced_by", pa.int64()),
            ("origin_write_id", pa.int64()),
            ("generation", pa.int32()),
        ]
    ),
    partition_by=("run_id",),
    sort_by=("rank", "write_id"),
)
"""Writes withdrawn after they were committed, by a tombstone rather than a deletion.

A plain discard (``replaced_by`` null: a capture window that ended in an exception)
hides every invocation, core and record of the write, and of any rewrite of it by a
compaction. A supersession (``replaced_by`` set) is how a compaction of a remote store
commits: the write's rows were copied under the fresh write id ``replaced_by``,
``generation`` rewrites away from the write ``origin_write_id`` its writer made. Of
the rewrites of one origin, the views show the one of the highest (generation,
write id) that a supersession names, and the origin itself only while none does: one
file of supersessions switches a run's rows from the old files to the merged ones at
once, and two compactions racing each other still leave one copy in view."""

TRACE_EVENTS = TableSpec(
    name="trace_events",
    schema=pa.schema(
        [
            ("write_id", pa.int64()),
            ("event_index", pa.int64()),
            ("ph", pa.string()),
            ("cat", pa.string()),
            ("name", pa.string()),
            ("pid", pa.int64()),
            ("tid", pa.int64()),
            ("pid_name", pa.string()),
            ("tid_name", pa.string()),
            ("ts_ns", pa.int64()),
            ("dur_ns", pa.int64()),
            ("flow_id", pa.string()),
            ("correlation", pa.int64()),
            ("external_id", pa.int64()),
            ("stream", pa.int64()),
            ("device", pa.int64()),
            ("task_type", pa.string()),
            ("args", pa.string()),
        ]
    ),
    partition_by=("source_id",),
    delta_columns=("event_index",),
    dictionary_columns=("ph", "cat", "name", "pid_name", "tid_name", "task_type"),
    row_group_rows=1 << 17,
)
"""Events of outer traces (torch.profiler / kineto, torch_npu), one file per ingest of a
source. ``pid`` / ``tid`` hold integer values and ``pid_name`` / ``tid_name`` string
ones; ``ts_ns`` / ``dur_ns`` are exact integer ns of the text's microseconds;
``flow_id`` is a flow's ``id`` as written (it may exceed 2^64); ``args`` is the JSON
text of the event's args as written. ``write_id`` joins the ``trace_sources`` row
written last, which commits the ingest."""

TRACE_SOURCES = TableSpec(
    name="trace_sources",
    schema=pa.schema(
        [
            ("write_id", pa.int64()),
            ("ingested_at", _TIME),
            ("path", pa.string()),
            ("sha256", pa.string()),
            ("file_bytes", pa.int64()),
            ("text_bytes", pa.int64()),
            ("compressed", pa.bool_()),
            ("form", pa.string()),
            ("event_count", pa.int64()),
            ("rank", pa.int32()),
            ("label", pa.string()),
            ("tags", _STRING_MAP),
            ("metadata", pa.string()),
            ("base_time_ns", pa.int64()),
            ("first_ts_ns", pa.int64()),
            ("last_ts_ns", pa.int64()),
            ("rounded_count", pa.int64()),
            ("layout", pa.string()),
            ("job_id", pa.string()),
            ("device", pa.int32()),
            ("parallel", pa.string()),
            ("profiler_outputs", pa.string()),
        ]
    ),
    partition_by=("source_id",),
    sort_by=("ingested_at",),
)
"""One row per outer trace file in the store (its id: the first 16 hex digits of the
SHA-256 of its bytes): where it came from, its form (``object`` or bare ``array``),
its top-level fields other than ``traceEvents`` as JSON text (``metadata``), its rank
(given, else ``distributedInfo.rank``), and the byte layout of its text that fusion
streams it by (``layout``). ``job_id`` names the job whose ranks it is one of (the ranks of
one ``ingest-trace`` call or one ``--job``; a trace alone is its own job, its source id),
``device`` the rank's device where the profiler wrote it, ``parallel`` the job's parallel
layout as the profiler wrote it (JSON text: ``distributed_args`` and
``parallel_group_info`` of torch_npu's ``profiler_metadata.json``), and
``profiler_outputs`` the profiler's own per-rank tables beside the trace (JSON text:
msprof's ``step_trace_time`` rows and ``communication`` ops). A rank whose output holds
those tables but no trace (msprof's simplified export) has a row with no events (form
``outputs``). Files written before these four columns existed read them as NULL."""

OPTIONAL_COLUMNS = {
    INVOCATIONS.name: (
        "producer",
        "producer_format",
        "clock_domain",
        "host_launch_ns",
        "host_sync_ns",
    ),
    CORES.name: CLOCK_COLUMNS,
    TASKS.name: ("depends_on",),
}
"""Columns that some writers leave out (imported producers' data, which mcprof's own writers
lack; the host's launch times, which only a capture session has): a writer's rows without
them are written with them null (``StoreWrites``)."""

TABLES = {
    spec.name: spec
    for spec in (RUNS, INVOCATIONS, CORES, RECORDS, TASKS, DISCARDS, TRACE_EVENTS, TRACE_SOURCES)
}


def _grouped(spec: TableSpec) -> TableSpec:
    """The spec of a ``spec`` file that holds several steps: in the run's directory, with
    ``step`` as its first column."""
    return replace(
        spec,
        schema=spec.schema.insert(0, pa.field("step", pa.int64())),
        partition_by=("run_id",),
    )


GROUPED = {spec.name: _grouped(spec) for spec in (CORES, RECORDS)}
"""Step-partitioned tables whose files may also hold several steps each (a capture
writer's group of steps: one file per table instead of one per step). Such a file lies
in the run's directory (``records/run_id=<run>/part-*.parquet``), beside the step
directories of the files of one step, and carries ``step`` as a column; its steps' rows
are contiguous, in step order, so a filter on one step prunes by the column's statistics
where it cannot by path."""


def file_spec(spec: TableSpec, directory_keys: int) -> TableSpec:
    """The spec of a file of ``spec`` below ``directory_keys`` partition directories: the
    grouped one for a step-partitioned table's file in the run's directory."""
    if directory_keys < len(spec.partition_by) and spec.name in GROUPED:
        return GROUPED[spec.name]
    return spec
