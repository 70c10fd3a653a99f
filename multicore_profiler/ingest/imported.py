"""Another profiler's launches as ordinary store rows: the one writer every importer uses.

An importer (``ingest/import_<format>.py``) reads its producer's file and yields
``ImportedInvocation`` values: the kernel, its clock, its cores and its records in chunks
of the store's record columns. ``write_imported`` writes them as one step of a run: the
records stream to Parquet chunk by chunk (memory bounded by a chunk, not the file), each
core's counts and first cycle are gathered on the way, and the invocations file, written
last, commits the whole import at once; nothing of a refused file is visible.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from multicore_profiler.abi import CORE_NAMES, PHASES
from multicore_profiler.errors import ImportFormatError
from multicore_profiler.ingest.decode import phase_dictionary
from multicore_profiler.ingest.step_rows import INVOCATION_ROWS, RECORD_ROWS
from multicore_profiler.storage.claims import claimed_ids
from multicore_profiler.storage.runs import RunInfo
from multicore_profiler.storage.schema import CORES, RECORDS
from multicore_profiler.storage.store import Store
from multicore_profiler.storage.writes import StagedStep, new_write_id

CLOCK_DOMAINS = ("shared", "anchored", "per_core")
"""``invocations.clock_domain``: one counter for all cores; a counter per core placed on a
common clock by an anchor (``cores.clock_offset_cycles``); a counter per core, no anchor."""

RECORD_COLUMNS = tuple(n for n in RECORD_ROWS.names if n not in ("rank", "invocation_id"))
"""The columns of an imported record chunk: the store's, less what the writer stamps."""
_PHASE_TYPE = pa.dictionary(pa.int8(), pa.string())
_CORE_KEY = ("core_type", "block_id")


def phase_column(codes: np.ndarray) -> pa.DictionaryArray:
    """Records' ``phase`` column from their phase codes (indices into ``abi.PHASES``: 0
    compute, 1 wait, 2 trigger, 3 terminate), with the dictionary the decoder writes."""
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, np.int8)), phase_dictionary())


@dataclass(frozen=True)
class CoreClock:
    """Where an ``anchored`` core's own counter lies on its invocation's common clock:
    ``offset_cycles`` is added to its raw cycles, and the anchor allows any offset from
    ``low_cycles`` to ``high_cycles`` (None: that side is open)."""

    offset_cycles: int
    low_cycles: int | None = None
    high_cycles: int | None = None


@dataclass(frozen=True)
class ImportedInvocation:
    """One launch of another profiler's kernel, as the store keeps it.

    ``records`` yields tables (or record batches) of ``RECORD_COLUMNS``, ``phase`` as text
    (one of ``abi.PHASES``); the writer numbers nothing and sorts nothing: each record keeps
    the ``record_index`` its importer gave it (its position on its core). ``dropped`` holds
    per core (``(core_type, block_id)``) the records the producer lost, ``clocks`` the offsets
    of an ``anchored`` invocation's cores. ``anchor_cycle`` is the invocation's time zero on
    the common clock (None: its earliest record's start).
    """

    kernel_name: str
    frequency_hz: float
    producer: str
    producer_format: str
    records: Iterable[pa.Table | pa.RecordBatch]
    source: str
    """The file (and where in it) the launch came from, for errors."""
    clock_domain: str = "shared"
    stage_names: Mapping[int, str] = field(default_factory=dict)
    owner_label: str | None = None
    dropped: Mapping[tuple[int, int], int] = field(default_factory=dict)
    clocks: Mapping[tuple[int, int], CoreClock] = field(default_factory=dict)
    anchor_cycle: int | None = None
    rank: int = 0
    device: int = 0
    direction: str = "forward"
    soc: str | None = None
    config_id: str | None = None
    """The task graph the launch ran (its ``tasks`` rows carry this config id), if any."""
    tasks: pa.Table | None = None
    """The launch's task graph as ``tasks`` rows (``TASKS.schema``), where the producer
    recorded one; rows of one config id given by several launches are written once."""

    def __post_init__(self) -> None:
        if self.clock_domain not in CLOCK_DOMAINS:
            raise ImportFormatError(
                f"{self.source}: clock domain {self.clock_domain!r} is none of {CLOCK_DOMAINS}"
            )
        if (self.clock_domain == "anchored") != bool(self.clocks):
            raise ImportFormatError(
                f"{self.source}: an anchored clock domain needs each core's clock offset, "
                "and only it has them"
            )
        if not (np.isfinite(self.frequency_hz) and self.frequency_hz > 0):
            raise ImportFormatError(
                f"{self.source}: the cycle frequency must be a positive number of Hz, "
                f"got {self.frequency_hz!r}"
            )


@dataclass(frozen=True)
class ImportedRun:
    """What ``write_imported`` wrote: the run, its write and its invocations."""

    run_id: str
    write_id: int
    invocation_ids: range
    records: int


def write_imported(
    store: Store,
    invocations: Iterable[ImportedInvocation],
    *,
    run_id: str | None = None,
    label: str | None = None,
    tags: Mapping[str, str] | None = None,
    step: int = 0,
) -> ImportedRun:
    """Write imported launches as one step of a new run (or of ``run_id``, created if the
    store has none), with their task graphs; return what was written.

    Every launch takes the next invocation id of its rank. The invocations file is written
    last and commits all of them; a launch that fails midway (its file is truncated, a
    record contradicts its header) leaves no visible row.
    """
    launches = list(invocations)
    if not launches:
        raise ImportFormatError("nothing to import: no launch was read")
    known = run_id is not None and bool(
        store.sql("SELECT 1 FROM runs WHERE run_id = $1", [run_id]).num_rows
    )
    producers = sorted({(i.producer, i.producer_format) for i in launches})
    new_run = None
    if not known:
        run_tags = {"producer": ",".join(sorted({p for p, _ in producers}))}
        run_tags["producer_format"] = ",".join(f"{p}:{f}" for p, f in producers)
        new_run = RunInfo.begin(run_id=run_id, label=label, tags={**run_tags, **(tags or {})})
        run_id = new_run.run_id
    assert run_id is not None
    per_rank = Counter(i.rank for i in launches)
    write_id = new_write_id()
    rows: list[pa.Table] = []
    records = 0
    taken: Counter[int] = Counter()
    with ExitStack() as held:
        firsts = {
            rank: held.enter_context(claimed_ids(store, run_id, rank, count))
            for rank, count in sorted(per_rank.items())
        }
        for launch in launches:
            invocation_id = firsts[launch.rank] + taken[launch.rank]
            taken[launch.rank] += 1
            row, count = _write_launch(store, run_id, step, write_id, invocation_id, launch)
            rows.append(row)
            records += count
        graphs = {i.config_id: i.tasks for i in launches if i.tasks is not None}
        if graphs:
            store.write_tasks(run_id, pa.concat_tables(list(graphs.values())))
        store.commit(run_id, [StagedStep(write_id, pa.concat_tables(rows))])
    if new_run is not None:
        store.write_run(new_run.finish())
    first = min(firsts.values())
    return ImportedRun(run_id, write_id, range(first, first + len(launches)), records)


def _write_launch(
    store: Store,
    run_id: str,
    step: int,
    write_id: int,
    invocation_id: int,
    launch: ImportedInvocation,
) -> tuple[pa.Table, int]:
    """Stream one launch's records to the store; return its invocation row (not written:
    the commit writes all of them) and its record count."""
    cores = _CoreTally(launch)
    ids = (
        pa.scalar(launch.rank, pa.int32()),
        pa.scalar(invocation_id, pa.int64()),
        pa.scalar(write_id, pa.int64()),
    )

    def chunks() -> Iterator[pa.Table]:
        for chunk in launch.records:
            table = _record_chunk(chunk, launch.source)
            if not table.num_rows:
                continue
            cores.add(table)
            count = table.num_rows
            yield pa.table(
                [*(pa.repeat(value, count) for value in ids), *table.columns],
                names=["rank", "invocation_id", "write_id", *table.column_names],
            )

    partition = {"run_id": run_id, "step": step}
    if not _written(store, partition, chunks()):
        raise ImportFormatError(f"{launch.source}: the launch holds no record")
    cores.check_clocks()
    core_rows = cores.table(launch.rank, invocation_id, write_id)
    store.write_file(CORES, partition, core_rows, durable=False)
    anchor = cores.anchor() if launch.anchor_cycle is None else launch.anchor_cycle
    values = {
        "rank": launch.rank,
        "device": launch.device,
        "step": step,
        "invocation_id": invocation_id,
        "direction": launch.direction,
        "kernel_name": launch.kernel_name,
        "soc": launch.soc,
        "frequency_hz": float(launch.frequency_hz),
        "frequency_source": "producer",
        "anchor_cycle": anchor,
        "aic_slots": None,
        "aiv_slots": None,
        "aic_capacity": None,
        "aiv_capacity": None,
        "record_count": cores.records,
        "dropped_count": cores.dropped,
        "owner_label": launch.owner_label,
        "stage_names": sorted((int(k), str(v)) for k, v in launch.stage_names.items()),
        "window_id": None,
        "config_id": launch.config_id,
        "partial_slots": [],
        "abi_generation": None,
        "producer": launch.producer,
        "producer_format": launch.producer_format,
        "clock_domain": launch.clock_domain,
    }
    row = pa.Table.from_pylist([values], schema=INVOCATION_ROWS)
    row = row.add_column(
        INVOCATION_ROWS.get_field_index("invocation_id") + 1, "write_id", pa.array([write_id])
    )
    return row.append_column("origin_write_id", pa.nulls(1, pa.int64())), cores.records


def _written(store: Store, partition: dict[str, object], chunks: Iterator[pa.Table]) -> bool:
    """Write the record chunks as one file of the partition (none if they are empty)."""
    first = next(chunks, None)
    if first is None:
        return False

    def all_chunks() -> Iterator[pa.Table]:
        yield first
        yield from chunks

    store.write_file(RECORDS, partition, all_chunks(), durable=False)
    return True


def _record_chunk(chunk: pa.Table | pa.RecordBatch, source: str) -> pa.Table:
    """A chunk in the store's record types, checked: known phases, no record ending before
    it starts."""
    table = pa.Table.from_batches([chunk]) if isinstance(chunk, pa.RecordBatch) else chunk
    missing = [n for n in RECORD_COLUMNS if n not in table.column_names]
    if missing:
        raise ImportFormatError(f"{source}: record rows lack {missing}")
    table = table.select(RECORD_COLUMNS)
    phase = table["phase"]
    if not pa.types.is_dictionary(phase.type):
        unknown = pc.unique(phase.filter(pc.invert(pc.is_in(phase, pa.array(PHASES))))).to_pylist()
        if unknown:
            raise ImportFormatError(f"{source}: records of unknown phases {unknown}")
        phase = pc.dictionary_encode(phase).cast(_PHASE_TYPE)
        table = table.set_column(table.schema.get_field_index("phase"), "phase", phase)
    schema = pa.schema([RECORD_ROWS.field(n) for n in RECORD_COLUMNS])
    table = table.cast(schema)
    backwards = pc.less(table["end_cycle"], table["start_cycle"])
    if pc.any(backwards).as_py():
        at = pc.index(backwards, True).as_py()
        raise ImportFormatError(
            f"{source}: a record ends before it starts (core "
            f"{CORE_NAMES.get(table['core_type'][at].as_py())}/{table['block_id'][at]}, record "
            f"{table['record_index'][at]}: {table['start_cycle'][at]} .. {table['end_cycle'][at]})"
        )
    return table


class _CoreTally:
    """Per core of one launch, gathered over its record chunks: records, first start."""

    def __init__(self, launch: ImportedInvocation) -> None:
        self._launch = launch
        self._counts: dict[tuple[int, int], int] = {}
        self._first: dict[tuple[int, int], int] = {}

    def add(self, table: pa.Table) -> None:
        grouped = table.group_by(list(_CORE_KEY)).aggregate(
            [("start_cycle", "count"), ("start_cycle", "min")]
        )
        for core_type, block_id, count, first in zip(
            *(grouped[n].to_pylist() for n in (*_CORE_KEY, "start_cycle_count", "start_cycle_min")),
            strict=True,
        ):
            key = (core_type, block_id)
            self._counts[key] = self._counts.get(key, 0) + count
            self._first[key] = min(first, self._first.get(key, first))

    @property
    def records(self) -> int:
        return sum(self._counts.values())

    @property
    def dropped(self) -> int:
        return sum(self._launch.dropped.values())

    def check_clocks(self) -> None:
        """``ImportFormatError`` unless every core of an anchored launch has an offset that
        keeps its records at or after cycle 0 of the common clock."""
        if self._launch.clock_domain != "anchored":
            return
        for key, first in self._first.items():
            clock = self._launch.clocks.get(key)
            core = f"core {CORE_NAMES.get(key[0])}/{key[1]}"
            if clock is None:
                raise ImportFormatError(
                    f"{self._launch.source}: {core} of an anchored launch has no clock offset"
                )
            if first + clock.offset_cycles < 0:
                raise ImportFormatError(
                    f"{self._launch.source}: {core}'s clock offset {clock.offset_cycles} places "
                    "its first record before cycle 0"
                )

    def anchor(self) -> int:
        """The launch's earliest record start on the common clock (clocks checked)."""
        anchored = self._launch.clock_domain == "anchored"
        return min(
            first + (self._launch.clocks[key].offset_cycles if anchored else 0)
            for key, first in self._first.items()
        )

    def table(self, rank: int, invocation_id: int, write_id: int) -> pa.Table:
        keys = sorted(set(self._counts) | set(self._launch.dropped))
        unknown = sorted(set(self._launch.dropped) - set(self._counts))
        rows = []
        for slot, key in enumerate(keys):
            clock = self._launch.clocks.get(key) if key not in unknown else None
            rows.append(
                {
                    "rank": rank,
                    "invocation_id": invocation_id,
                    "write_id": write_id,
                    "slot": slot,
                    "core_type": key[0],
                    "block_id": key[1],
                    "entry_cycle": self._first.get(key, 0),
                    "record_count": self._counts.get(key, 0),
                    "dropped_count": self._launch.dropped.get(key, 0),
                    "record_capacity": None,
                    "clock_offset_cycles": None if clock is None else clock.offset_cycles,
                    "clock_low_cycles": None if clock is None else clock.low_cycles,
                    "clock_high_cycles": None if clock is None else clock.high_cycles,
                }
            )
        return pa.Table.from_pylist(rows, schema=CORES.schema)
