"""FlashInfer, Mirage MPK and Triton-distributed raw profile buffers: one slot scheme,
three tag layouts.

All three producers write a ``uint64`` buffer: slot 0 holds ``{nblocks u32, ngroups u32}``
(Triton-distributed then one ``{pid u32, smid u32}`` slot per block), and the k-th record
of writer (block, group) lies at slot ``first + k * nblocks * ngroups + block * ngroups +
group``, an 8-byte ``{tag u32, globaltimer_lo u32}``. The tag's fields differ per producer
(``TAG_LAYOUTS``); (block, group) always come from the slot position, and the tag's own
copy of the writer only checks the header. A begin and its end (same writer and event, for
MPK also the same per-worker task counter) become one span; an instant a zero-length one.
The 32-bit ns counter wraps every 4.29 s: each writer's times are unwrapped in record order,
and a step the wrap makes ambiguous (over half the period) is refused.

One buffer is one launch. Writers are decoded in batches of about ``2 * CHUNK_ROWS``
slots, twice: a first pass checks every record and keeps four numbers per span (its core,
start, desc id and order) to number records per core and per stage over the launch; the
second hands the records over, a batch at a time, in chunks of at most ``CHUNK_ROWS`` rows.
A refused buffer is refused before any record is handed over.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from multicore_profiler.abi import DESC_TRIGGER_EVENT, DESC_WAIT_DEPENDENCY, CoreType
from multicore_profiler.errors import DroppedRecordsWarning, ImportFormatError
from multicore_profiler.ingest.imported import ImportedInvocation, phase_column
from multicore_profiler.ingest.imports import ImportOptions
from multicore_profiler.ingest.mapped_file import MappedFile

CHUNK_ROWS = 1 << 18
GATHER_BYTES = 16 << 20
"""The buffer's rows read between two releases of its map's pages."""
WRAP = 1 << 32
"""The period of ``globaltimer_lo``, in ns (4.29 s)."""
AMBIGUOUS_STEP = 1 << 31
"""A step between two records of one writer at or above this (2.15 s, half the wrap) could
also be that plus any number of wraps: it is refused rather than guessed."""
EMPTY_TRITON = 0x7FFF_FFFF_FFFF_FFFF
"""Triton-distributed's filler of unwritten slots (FlashInfer and MPK leave them 0)."""
Rows = np.ndarray | slice
"""Rows of a batch's records: indices, or a strided slice where that is what they are."""
GROUP_RADIX = 1000
"""``owner_id`` = block x 1000 + group where a launch has several groups (else the block)."""
NO_TASK = 0xFFFF_FFFF
BEGIN, END, INSTANT = 0, 1, 2
SCHD_EVENTS = 201
"""MPK's ``TASK_SCHD_EVENTS``: the span of enqueuing a fired event, a trigger."""
WAIT_NAME = "scoreboard_wait_deps"
AUX_NAMES = (WAIT_NAME, "task_decoding", "load_before_wait")
"""Triton-distributed's megakernel spans that belong to the task that follows them."""

MPK_TASK_NAMES = {
    10: "TASK_BEGIN_TASK_GRAPH", 101: "TASK_EMBEDDING", 102: "TASK_RMS_NORM_LINEAR",
    103: "TASK_ATTENTION_1", 104: "TASK_ATTENTION_2",
    105: "TASK_SILU_MUL_LINEAR_WITH_RESIDUAL", 106: "TASK_ALLREDUCE", 107: "TASK_REDUCE",
    108: "TASK_LINEAR_WITH_RESIDUAL", 109: "TASK_ARGMAX", 110: "TASK_ARGMAX_PARTIAL",
    111: "TASK_ARGMAX_REDUCE", 112: "TASK_FIND_NGRAM_PARTIAL", 113: "TASK_FIND_NGRAM_GLOBAL",
    114: "TASK_TARGET_VERIFY_GREEDY", 115: "TASK_SINGLE_BATCH_EXTEND_ATTENTION",
    116: "TASK_PAGED_ATTENTION_1", 117: "TASK_PAGED_ATTENTION_2", 118: "TASK_SILU_MUL",
    119: "TASK_RMS_NORM", 120: "TASK_LINEAR", 121: "TASK_IDENTITY",
    150: "TASK_HOPPER_TASK_BEGIN", 151: "TASK_LINEAR_WITH_RESIDUAL_HOPPER",
    152: "TASK_LINEAR_HOPPER", 153: "TASK_PAGED_ATTENTION_HOPPER", 154: "TASK_RMS_NORM_HOPPER",
    155: "TASK_LINEAR_SWAPAB_HOPPER", 156: "TASK_LINEAR_SWAPAB_WITH_RESIDUAL_HOPPER",
    157: "TASK_LINEAR_CUTLASS_HOPPER", 158: "TASK_LINEAR_CUTLASS_WITH_RESIDUAL_HOPPER",
    159: "TASK_SILU_MUL_HOPPER", 160: "TASK_EMBEDDING_HOPPER", 161: "TASK_MOE_W13_LINEAR_SM90",
    162: "TASK_MOE_W2_LINEAR_SM90", 163: "TASK_SPLITK_LINEAR_SWAPAB_HOPPER",
    164: "TASK_PAGED_ATTENTION_SPLIT_KV_HOPPER", 198: "TASK_HOPPER_TASK_END",
    200: "TASK_SCHD_TASKS", 201: "TASK_SCHD_EVENTS", 202: "TASK_GET_EVENT",
    203: "TASK_GET_NEXT_TASK", 204: "TASK_SCHD_PREPARE_BATCH", 230: "TASK_SM100_TASK_BEGIN",
    231: "TASK_SM100_TMA_START_TASK", 246: "TASK_SPLITK_LINEAR_FP8_SWAPAB_SM100",
    247: "TASK_LINEAR_FP8_SWAPAB_SM100", 248: "TASK_MOE_W13_FP8_SM100",
    249: "TASK_MOE_W2_FP8_SM100", 250: "TASK_LINEAR_FP8_SWAPAB_WITH_RESIDUAL_SM100",
    251: "TASK_SPLITK_LINEAR_SM100", 252: "TASK_LINEAR_WITH_RESIDUAL_SM100",
    253: "TASK_LINEAR_SM100", 254: "TASK_MOE_W13_LINEAR_SM100", 255: "TASK_MOE_W2_LINEAR_SM100",
    256: "TASK_SM100_TMA_END_TASK", 257: "TASK_ATTN_SM100", 258: "TASK_ARGMAX_REDUCE_SM100",
    259: "TASK_ARGMAX_PARTIAL_SM100", 260: "TASK_MOE_TOPK_SOFTMAX_SM100",
    261: "TASK_MOE_MUL_SUM_ADD_SM100", 262: "TASK_TENSOR_INIT",
    263: "TASK_PAGED_ATTENTION_SPLIT_KV_SM100", 264: "TASK_PAGED_ATTENTION_SPLIT_KV_MERGE_SM100",
    265: "TASK_SAMPLING_SM100", 266: "TASK_MLA_DECODE_SM100", 267: "TASK_MLA_REDUCE_SM100",
    268: "TASK_MLA_PREFILL_SM100", 269: "TASK_MLA_MTP_DECODE_SM100",
    270: "TASK_MLA_MTP_REDUCE_SM100", 271: "TASK_MTP_VERIFY_STRICT",
    272: "TASK_MTP_ACCEPT_COMMIT", 273: "TASK_MTP_TOKEN_SCATTER", 274: "TASK_MTP_PREPARE_VERIFY",
    275: "TASK_QUANTIZE_FP8_SM100", 276: "TASK_LINEAR_FP8_SM100",
    277: "TASK_LINEAR_FP8_WITH_RESIDUAL_SM100", 278: "TASK_MLA_KV_GATHER_SM100",
    279: "TASK_LINEAR_FP8_BMM_SM100", 280: "TASK_MOE_TOPK_SIGMOID_SM100",
    281: "TASK_ELEMENTWISE_ADD_SM100", 282: "TASK_SOFTMAX_GATHER_SM100",
    283: "TASK_MTP_VERIFY_PROBABILISTIC", 284: "TASK_PROB_SCATTER_SM100",
    285: "TASK_MTP_FLOAT_SCATTER", 286: "TASK_PROB_EXTRACT_SM100",
    291: "TASK_MLA_MTP_DECODE_TP8_SM100", 292: "TASK_MLA_MTP_DECODE_TP_REDUCE_SM100",
    293: "TASK_MLA_KV_GATHER_SPLIT_SM100", 294: "TASK_MTP_BUILD_EMBED_INPUT",
    295: "TASK_MLA_PREFILL_TP8_SM100", 296: "TASK_DFLASH_ATTENTION_SM100",
    297: "TASK_DFLASH_NORM_ROPE_SM100", 298: "TASK_DFLASH_KV_STORE_SM100",
    301: "TASK_NVSHMEM_ALLGATHER_STRIDED_PUT", 302: "TASK_NVSHMEM_TILE_ALLREDUCE",
    303: "TASK_NVSHMEM_GLOBAL_ARGMAX", 304: "TASK_DEEPSEEK_MLA_ROPE_SM100",
    306: "TASK_FP8_GEMM_DENSE_SM100", 309: "TASK_FUSED_RMSNORM_QUANTIZE_FP8_SM100",
    312: "TASK_FP8_GROUP_GEMM_LARGEM_SM100", 313: "TASK_MOE_PERMUTE_SM100",
    314: "TASK_MOE_UNPERMUTE_SM100", 318: "TASK_DSV3_ROUTER_GATE_GEMV_SM100",
    319: "TASK_ATTN_BLOCK_MEGAKERNEL_SM100", 322: "TASK_LINEAR_FP8_BMM_DENSE_SM100",
    323: "TASK_MLA_KV_APPEND_SM100", 325: "TASK_FFN_FULL_MEGAKERNEL_SM100",
    328: "TASK_MLA_PREFILL_TP8_CHUNKED_SM100",
}  # fmt: skip
"""MPK's task type names: ``event_name_list`` of mirage's ``python/mirage/mpk/
profiler_persistent.py`` (mirage-project/mirage @ 019240ef); other types are TASK_<n>."""


@dataclass(frozen=True)
class TagLayout:
    """One producer's tag: ``(shift, mask)`` of each field, its meta slots and defaults."""

    kernel_name: str
    kind: tuple[int, int]
    event: tuple[int, int]
    writer: tuple[int, int]
    """The tag's own copy of the writer, compared with the slot position's."""
    writer_is_block: bool
    """FlashInfer's field holds the block only; the others hold block x ngroups + group."""
    smid: tuple[int, int] | None = None
    event_no: tuple[int, int] | None = None
    meta_slots: bool = False
    start_is_one: bool = False


TAG_LAYOUTS = {
    "flashinfer": TagLayout(
        "flashinfer", kind=(0, 0x3), event=(2, 0x3FF), writer=(12, 0xFFF),
        writer_is_block=True, smid=(24, 0xFF),
    ),
    "mpk": TagLayout(
        "mpk", kind=(0, 0x3), event=(2, 0x1FF), writer=(11, 0xFF),
        writer_is_block=False, event_no=(19, 0x1FFF),
    ),
    "triton-distributed": TagLayout(
        "triton-distributed", kind=(0, 0x1), event=(1, 0x7FF), writer=(12, 0xFFFFF),
        writer_is_block=False, meta_slots=True, start_is_one=True,
    ),
}  # fmt: skip


def read(path: Path, options: ImportOptions) -> Iterator[ImportedInvocation]:
    """The one launch of a raw buffer saved as ``.npy``, ``.pt`` (a single tensor) or
    little-endian ``.bin``, or of the ``.perfetto-trace`` its producer wrote from one (told
    apart by their content)."""
    from multicore_profiler.ingest import import_tg4perfetto  # it builds on this module

    if import_tg4perfetto.is_perfetto_trace(path):
        yield from import_tg4perfetto.read_trace(path, options)
        return
    slots, mapped = load_buffer(path)
    yield decode(slots, TAG_LAYOUTS[options.format], options, str(path), mapped)


def load_buffer(path: Path) -> tuple[np.ndarray, MappedFile | None]:
    """The buffer's slots as little-endian ``uint64``, and the map they are a view of
    where the file allows one (its pages are released after each batch of writers)."""
    suffix = path.suffix.lower()
    mapped = None
    try:
        if suffix == ".npy":
            array = np.load(path, mmap_mode="r", allow_pickle=False)
            if array.size and array.flags.c_contiguous:
                mapped = MappedFile(path)
                array = mapped.array(array.dtype, array.offset, array.size)
        elif suffix == ".pt":
            array = _load_torch(path)
        elif suffix == ".bin":
            size = path.stat().st_size
            if size % 8:
                raise ImportFormatError(
                    f"{path}: {size} bytes is not a whole number of 8-byte slots "
                    "(a truncated file?)"
                )
            if not size:
                raise ImportFormatError(f"{path}: the file is empty")
            mapped = MappedFile(path)
            array = mapped.array("<u8")
        else:
            raise ImportFormatError(
                f"{path}: a raw profile buffer must be saved as .npy, .pt or .bin"
            )
    except (ValueError, EOFError, OSError) as error:
        raise ImportFormatError(f"{path}: cannot read the buffer ({error})") from error
    if array.dtype.kind not in "iu" or array.dtype.itemsize != 8:
        raise ImportFormatError(f"{path}: the buffer holds {array.dtype}, not 64-bit slots")
    flat = array.reshape(-1)
    if flat.dtype.byteorder == ">":
        return flat.astype("<u8"), None
    return flat.view("<u8"), mapped


def _load_torch(path: Path) -> np.ndarray:
    """A ``torch.save``'d single tensor, read without unpickling arbitrary objects."""
    try:
        import torch
    except ImportError as error:
        raise ImportFormatError(
            f"{path}: reading a .pt buffer needs torch (pip install torch), or save it "
            "with numpy.save as .npy"
        ) from error
    try:
        value = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # torch raises whatever its unpickler meets
        raise ImportFormatError(f"{path}: not a torch tensor file ({error})") from error
    if not isinstance(value, torch.Tensor):
        raise ImportFormatError(
            f"{path}: holds a {type(value).__name__}, not a single tensor of the buffer"
        )
    if value.dtype not in (torch.uint64, torch.int64):
        raise ImportFormatError(f"{path}: the tensor holds {value.dtype}, not 64-bit slots")
    return value.contiguous().numpy()


@dataclass
class _Records:
    """The written records of a buffer, writer by writer in record order."""

    writer: np.ndarray
    k: np.ndarray
    tag: np.ndarray
    time: np.ndarray
    """Unwrapped ns (int64)."""
    counts: np.ndarray
    """Records per writer column."""


@dataclass(frozen=True)
class _Header:
    """What slot 0 (and Triton-distributed's meta slots) say, checked against the buffer."""

    nblocks: int
    ngroups: int
    first: int
    """The slot of the first record row."""
    length: int
    sm_of_block: np.ndarray | None
    reference: int
    """The raw time of the first writer's first record: times count from it."""

    @property
    def writers(self) -> int:
        return self.nblocks * self.ngroups


@dataclass
class _Spans:
    """The records of a batch of writers, writer by writer in record order; times relative
    to the header's reference, task ids counted from the batch's first."""

    columns: dict[str, np.ndarray]
    events: np.ndarray
    dropped: dict[tuple[int, int], int]
    tasks: int
    """The batch's tasks (spans that take a number of their own)."""


def decode(
    slots: np.ndarray,
    layout: TagLayout,
    options: ImportOptions,
    source: str,
    mapped: MappedFile | None = None,
) -> ImportedInvocation:
    """One launch from a buffer's slots, decoded by ``layout``: every check runs over all
    writers (a batch at a time) before any record is handed over. ``mapped``: the map
    ``slots`` views, whose pages are released after each batch."""
    header = _header(slots, layout, source)
    release = mapped.release if mapped is not None else lambda: None
    aux = _aux_types(layout, options)
    rows = -(-(header.length - header.first) // header.writers)
    per_batch = max(1, 2 * CHUNK_ROWS // rows)
    batches = [
        range(w, min(w + per_batch, header.writers)) for w in range(0, header.writers, per_batch)
    ]
    cores, starts, descs, tasks, events = [], [], [], [], []
    dropped: dict[tuple[int, int], int] = {}
    for batch in batches:
        spans = _spans(slots, header, layout, aux, batch, source, release)
        cores.append(spans.columns["block_id"])
        starts.append(spans.columns["start_cycle"])
        descs.append(spans.columns["desc_id"])
        tasks.append(spans.tasks)
        events.append(np.flatnonzero(np.bincount(spans.events)))  # event fields: <= 11 bits
        dropped.update(spans.dropped)
    # Each whole-launch array is freed as soon as it is used: they are the import's
    # memory (about 40 bytes a span), besides one batch.
    start = np.concatenate(starts)
    starts.clear()
    if not len(start):
        raise ImportFormatError(f"{source}: the buffer holds no record")
    low = int(start.min())
    shift = (header.reference + low) % WRAP - low
    in_time = np.argsort(start, kind="stable")  # ties: writer, then record order
    del start
    record_index = _numbered(_joined(cores), in_time)  # one core type
    stage_index = _numbered(_joined(descs), in_time)
    del in_time
    if dropped:
        warnings.warn(
            f"{source}: {sum(dropped.values())} begins lost their end: their writers filled "
            "the buffer (counted as dropped records)",
            DroppedRecordsWarning,
            stacklevel=3,
        )

    def records() -> Iterator[pa.Table]:
        done, task_base = 0, 0
        for batch, batch_tasks in zip(batches, tasks, strict=True):
            columns = _spans(slots, header, layout, aux, batch, source, release).columns
            count = len(columns["start_cycle"])
            columns["start_cycle"] += shift
            columns["end_cycle"] += shift
            task = columns["task_id"]
            if layout.event_no is None:
                task[task != NO_TASK] += np.uint32(task_base)
            columns["record_index"] = record_index[done : done + count]
            columns["stage_task_index"] = stage_index[done : done + count]
            yield from _chunks(columns)
            done, task_base = done + count, task_base + batch_tasks

    return ImportedInvocation(
        kernel_name=options.kernel_name or layout.kernel_name,
        frequency_hz=1e9,
        producer=layout.kernel_name,
        producer_format="raw-buffer",
        records=records(),
        source=source,
        clock_domain="shared",
        stage_names=_stage_names(layout, options, np.unique(np.concatenate(events)), aux),
        owner_label="Block" if header.ngroups == 1 else "BlockX1000+Group",
        dropped=dropped,
        anchor_cycle=low + shift,
        rank=options.rank or 0,
    )


def _header(slots: np.ndarray, layout: TagLayout, source: str) -> _Header:
    """The checked header, and the reference time: the writers' first records (row 0)
    must lie within half a wrap of each other."""
    if len(slots) < 1:
        raise ImportFormatError(f"{source}: the buffer has no header slot")
    nblocks, ngroups = int(slots[0]) & 0xFFFF_FFFF, int(slots[0]) >> 32
    writers = nblocks * ngroups
    first = 1 + (nblocks if layout.meta_slots else 0)
    if not writers or len(slots) < first + writers:
        raise ImportFormatError(
            f"{source}: the header (slot 0) says {nblocks} blocks x {ngroups} groups, which "
            f"do not fit the buffer's {len(slots)} slots"
        )
    if ngroups > 1 and nblocks * GROUP_RADIX > NO_TASK:
        raise ImportFormatError(f"{source}: {nblocks} blocks are too many to number owners")
    if ngroups > GROUP_RADIX:
        raise ImportFormatError(f"{source}: the header's {ngroups} groups exceed {GROUP_RADIX}")
    sm_of_block = _block_sms(slots, nblocks, source) if layout.meta_slots else None
    row = np.asarray(slots[first : first + writers])
    written = row[(row != 0) & (row != np.uint64(EMPTY_TRITON) if layout.meta_slots else row != 0)]
    heads = (written >> np.uint64(32)).astype(np.int64)
    reference = int(heads[0]) if len(heads) else 0
    offset = _offsets(heads, reference)
    if len(heads) and offset.max() - offset.min() >= AMBIGUOUS_STEP:
        raise ImportFormatError(
            f"{source}: the writers' first records lie {int(offset.max() - offset.min())} ns "
            "apart modulo the 4.29 s wrap: their order cannot be decided"
        )
    return _Header(nblocks, ngroups, first, len(slots), sm_of_block, reference)


def _spans(
    slots: np.ndarray,
    header: _Header,
    layout: TagLayout,
    aux: dict[str, int],
    batch: range,
    source: str,
    release: Callable[[], None],
) -> _Spans:
    """The spans of writer columns ``batch``, checked."""
    writers, first, ngroups = header.writers, header.first, header.ngroups
    records = _written(slots[first:], header, layout, batch, source, release)

    def field(spec: tuple[int, int]) -> np.ndarray:
        return (records.tag >> np.uint32(spec[0])) & np.uint32(spec[1])

    block = records.writer // ngroups
    own = block if layout.writer_is_block else records.writer
    bad = field(layout.writer) != (own & layout.writer[1])
    if layout.writer_is_block and np.any(block >= 4096):
        at = int(np.argmax(block >= 4096))
        raise ImportFormatError(
            f"{source}: block {int(block[at])} (slot {_slot(records, at, writers, first)}) is "
            "past FlashInfer's 12-bit block field, which overflows into its SM id: the SM of "
            "its records cannot be known"
        )
    if np.any(bad):
        at = int(np.argmax(bad))
        raise ImportFormatError(
            f"{source}: slot {_slot(records, at, writers, first)} lies in writer (block "
            f"{int(block[at])}, group {int(records.writer[at] % ngroups)})'s column of a "
            f"{header.nblocks} x {ngroups} header, but its tag names writer field "
            f"{int(field(layout.writer)[at])}: the header contradicts the data"
        )
    kind = field(layout.kind)
    if layout.start_is_one:
        kind = np.where(kind == 1, BEGIN, END).astype(np.uint32)
    if np.any(kind > INSTANT):
        at = int(np.argmax(kind > INSTANT))
        raise ImportFormatError(
            f"{source}: slot {_slot(records, at, writers, first)} has event type "
            f"{int(kind[at])} (0 begin, 1 end, 2 instant)"
        )
    event = field(layout.event)
    event_no = field(layout.event_no) if layout.event_no else np.zeros_like(event)
    smid = field(layout.smid) if layout.smid else None
    spans, dropped_rows = _pair(records, kind, event, event_no, smid, header, source)
    return _columns(
        spans, records, dropped_rows, event, event_no, smid, header, layout, aux, source
    )


def _block_sms(slots: np.ndarray, nblocks: int, source: str) -> np.ndarray:
    """Triton-distributed's SM of each block (-1: the block wrote no meta slot). A meta slot
    of 0 is block 0 on SM 0, not an empty slot: the producer fills the buffer beforehand."""
    meta = np.asarray(slots[1 : 1 + nblocks])
    empty = meta == EMPTY_TRITON
    pid = (meta & np.uint64(0xFFFF_FFFF)).astype(np.int64)
    smid = (meta >> np.uint64(32)).astype(np.int64)
    wrong = ~empty & (pid != np.arange(nblocks))
    if np.any(wrong):
        at = int(np.argmax(wrong))
        raise ImportFormatError(
            f"{source}: meta slot {1 + at} names block {int(pid[at])}, not block {at}"
        )
    if np.any(~empty & (smid > 0xFF)):
        at = int(np.argmax(~empty & (smid > 0xFF)))
        raise ImportFormatError(
            f"{source}: meta slot {1 + at} gives block {at} SM id {int(smid[at])}, beyond 8 bits"
        )
    return np.where(empty, -1, smid)


def _written(
    data: np.ndarray,
    header: _Header,
    layout: TagLayout,
    columns: range,
    source: str,
    release: Callable[[], None],
) -> _Records:
    """The records of writer ``columns`` (each a prefix of its column), times unwrapped
    relative to the launch's reference. A batch's columns cross every row of the buffer:
    they are gathered ``GATHER_BYTES`` of rows at a time, the map's pages released after
    each (``release``), so that memory holds those rows, not the file."""
    writers, first = header.writers, header.first
    rows, full = -(-len(data) // writers), len(data) // writers
    grid = data[: full * writers].reshape(full, writers)
    values = np.zeros((len(columns), rows), dtype=np.uint64)  # a column per writer
    step = max(1, GATHER_BYTES // (8 * writers))
    for at in range(0, full, step):
        part = slice(at, min(at + step, full))
        values[:, part] = grid[part, columns.start : columns.stop].T
        release()
    if full < rows:  # the last row is partial
        tail = data[full * writers + columns.start : full * writers + columns.stop]
        values[: len(tail), full] = tail
        release()
    occupied = values != 0
    if layout.meta_slots:
        occupied &= values != np.uint64(EMPTY_TRITON)
    written = occupied.sum(axis=1)
    counts = np.zeros(writers, dtype=np.int64)
    counts[columns.start : columns.stop] = written
    partial = np.flatnonzero(written < rows)  # only these columns can hold a gap
    held = occupied[partial]
    if rows > 1 and np.any(held[:, 1:] > held[:, :-1]):
        gap = (held & (np.cumsum(~held, axis=1) > 0)).T
        k, w = (int(v[0]) for v in np.nonzero(gap))
        column = columns.start + int(partial[w])
        raise ImportFormatError(
            f"{source}: slot {first + k * writers + column} holds a record after an empty "
            f"slot of the same writer (column {column}): not this producer's layout, or a "
            "wrong header"
        )
    # Each column is a prefix: its records, writer by writer in record order.
    writer = np.repeat(np.arange(columns.start, columns.stop), written)
    if not len(partial):  # every column full
        values, k = values.reshape(-1), np.tile(np.arange(rows), len(written))
    else:
        values = values[occupied]
        k = np.arange(len(values)) - np.repeat(np.cumsum(written) - written, written)
    time = _unwrap((values >> np.uint64(32)).astype(np.int64), writer, k, header, source)
    tag = (values & np.uint64(0xFFFF_FFFF)).astype(np.uint32)
    return _Records(writer, k, tag, time, counts)


def _unwrap(
    raw: np.ndarray, writer: np.ndarray, k: np.ndarray, header: _Header, source: str
) -> np.ndarray:
    """Times relative to the launch's reference record: each record follows its writer's
    previous one by less than half the wrap; a writer's first record lies within half a
    wrap of the reference (``_header`` checked that for all of them)."""
    if not len(raw):
        return raw
    step = np.diff(raw) & (WRAP - 1)  # modulo the wrap (a power of two)
    starts = k == 0
    step = np.concatenate(([0], step))
    step[starts] = 0
    ambiguous = step >= AMBIGUOUS_STEP
    if np.any(ambiguous):
        at = int(np.argmax(ambiguous))
        raise ImportFormatError(
            f"{source}: record {int(k[at])} of writer column {int(writer[at])} (slot "
            f"{header.first + int(k[at]) * header.writers + int(writer[at])}) follows the "
            f"previous one by {int(step[at])} ns modulo the 32-bit ns counter's 4.29 s wrap: "
            "whether the counter wrapped in between cannot be decided"
        )
    offset = _offsets(raw[starts], header.reference)
    # Each writer's first step leads from the previous writer's last record to its own first
    # record's offset, so that one cumulative sum places every record.
    last = offset + np.add.reduceat(step, np.flatnonzero(starts))
    step[starts] = offset - np.concatenate(([0], last[:-1]))
    return np.cumsum(step)


def _offsets(heads: np.ndarray, reference: int) -> np.ndarray:
    """Raw 32-bit times as signed ns from ``reference``, within half a wrap of it."""
    return (heads.astype(np.int64) - reference + WRAP // 2) % WRAP - WRAP // 2


def _slot(records: _Records, at: int, writers: int, first: int) -> int:
    return first + int(records.k[at]) * writers + int(records.writer[at])


def _pair(
    records: _Records,
    kind: np.ndarray,
    event: np.ndarray,
    event_no: np.ndarray,
    smid: np.ndarray | None,
    header: _Header,
    source: str,
) -> tuple[tuple[Rows, Rows], np.ndarray]:
    """Begin/end pairs and instants as ``(start record, end record)`` row pairs, and the
    begins whose end the buffer had no room for (the writer filled its column)."""
    writers, first = header.writers, header.first
    n = len(kind)
    paired = np.flatnonzero(kind != INSTANT)
    every = len(paired) == n  # no instant: every span starts at a begin
    couples = _adjacent_couples(
        slice(None) if every else paired, records.writer, kind, event, event_no
    )
    if couples is not None:
        begins, ends = couples
        _same_sm(begins, ends, smid, records, header, source)
        if every:
            return (begins, ends), paired[:0]
        partner = np.full(n, -1, dtype=np.int64)
        partner[begins] = ends
        instants = np.flatnonzero(kind == INSTANT)
        partner[instants] = instants
        starts = np.flatnonzero(partner >= 0)
        return (starts, partner[starts]), paired[:0]
    # One key per (writer, event, event_no). The records come writer by writer in record
    # order, so a stable sort keeps each key's records in record order (by radix where the
    # keys fit 16 bits, as FlashInfer's few writers x events do).
    width = int(event.max(initial=0)) + 1, int(event_no.max(initial=0)) + 1
    key = (records.writer[paired] * width[0] + event[paired]) * width[1] + event_no[paired]
    small = len(key) == 0 or key.max() <= 0xFFFF
    order = np.argsort(key.astype(np.uint16) if small else key, kind="stable")
    paired, key = paired[order], key[order]
    new = np.concatenate(([True], key[1:] != key[:-1]))
    del key, order
    group_start = np.maximum.accumulate(np.where(new, np.arange(len(paired)), 0))
    parity = (np.arange(len(paired)) - group_start) % 2
    expected = np.where(parity == 0, BEGIN, END)
    wrong = kind[paired] != expected
    last = np.concatenate((new[1:], [True]))
    open_begin = last & (parity == 0) & ~wrong
    room = (header.length - first - np.arange(writers) - 1) // writers + 1
    writer_full = records.counts >= room
    stranded = open_begin & ~writer_full[records.writer[paired]]
    if np.any(wrong | stranded):
        at = int(np.argmax(wrong | stranded))
        row = int(paired[at])
        what = "an end without its begin" if kind[row] == END else "a begin without its end"
        raise ImportFormatError(
            f"{source}: slot {_slot(records, row, writers, first)} (record {int(records.k[row])} "
            f"of writer column {int(records.writer[row])}, event {int(event[row])}) is {what}"
        )
    begins = paired[(parity == 0) & ~open_begin]
    ends = paired[parity == 1]
    _same_sm(begins, ends, smid, records, header, source)
    partner = np.full(n, -1, dtype=np.int64)
    partner[begins] = ends
    instants = np.flatnonzero(kind == INSTANT)
    partner[instants] = instants
    starts = np.flatnonzero(partner >= 0)  # writer by writer, in record order
    return (starts, partner[starts]), paired[open_begin]


def _adjacent_couples(
    paired: np.ndarray | slice,
    writer: np.ndarray,
    kind: np.ndarray,
    event: np.ndarray,
    event_no: np.ndarray,
) -> tuple[Rows, Rows] | None:
    """``(begins, ends)`` where the begin/end records (``paired``; ``slice(None)``: all)
    come as adjacent couples of one writer and event, a begin then its end (the common
    case, unnested spans): the pairs the sort by key would give, found without sorting
    (as strided slices where ``paired`` is all). None where they do not."""
    if isinstance(paired, slice):
        if len(kind) % 2:
            return None
        begins, ends = slice(0, None, 2), slice(1, None, 2)
    else:
        if len(paired) % 2:
            return None
        begins, ends = paired[0::2], paired[1::2]
    if not (
        np.all(kind[begins] == BEGIN)
        and np.all(kind[ends] == END)
        and np.array_equal(writer[begins], writer[ends])
        and np.array_equal(event[begins], event[ends])
        and np.array_equal(event_no[begins], event_no[ends])
    ):
        return None
    return begins, ends


def _same_sm(
    begins: Rows,
    ends: Rows,
    smid: np.ndarray | None,
    records: _Records,
    header: _Header,
    source: str,
) -> None:
    """Refuse a span whose begin and end name different SMs."""
    if smid is None:
        return
    differ = smid[begins] != smid[ends]
    if np.any(differ):
        at = int(np.argmax(differ))
        writers, first = header.writers, header.first
        begin, end = (np.arange(len(smid))[rows][at] for rows in (begins, ends))
        raise ImportFormatError(
            f"{source}: slots {_slot(records, int(begin), writers, first)} and "
            f"{_slot(records, int(end), writers, first)} begin and end one span on SMs "
            f"{int(smid[begin])} and {int(smid[end])}"
        )


def _columns(
    spans: tuple[Rows, Rows],
    records: _Records,
    dropped_rows: np.ndarray,
    event: np.ndarray,
    event_no: np.ndarray,
    smid: np.ndarray | None,
    header: _Header,
    layout: TagLayout,
    aux: dict[str, int],
    source: str,
) -> _Spans:
    """The store's columns of paired spans (writer by writer, in record order), less their
    record and stage numbers, which need the whole launch."""
    begin, end = spans
    writer = records.writer[begin]
    block = writer // header.ngroups
    core_type, core = _cores(block, begin, smid, header.sm_of_block, layout, source)
    desc = event[begin].astype(np.uint32)
    phase = np.zeros(len(writer), dtype=np.int8)  # 0 compute, 1 wait, 2 trigger
    task = np.arange(len(writer), dtype=np.uint32)
    tasks = len(writer)
    if layout.event_no is not None:
        task = (block * (layout.event_no[1] + 1) + event_no[begin]).astype(np.uint32)
        trigger = desc == SCHD_EVENTS
        desc[trigger], phase[trigger] = DESC_TRIGGER_EVENT, 2
    elif aux:
        is_aux = np.isin(desc, list(aux.values()))
        task, tasks = _next_task(writer, is_aux), int(np.count_nonzero(~is_aux))
        wait = desc == aux[WAIT_NAME]
        desc[wait], phase[wait] = DESC_WAIT_DEPENDENCY, 1
    owner = block if header.ngroups == 1 else block * GROUP_RADIX + writer % header.ngroups
    dropped: dict[tuple[int, int], int] = {}
    if len(dropped_rows):
        d_type, d_core = _cores(
            records.writer[dropped_rows] // header.ngroups,
            dropped_rows,
            smid,
            header.sm_of_block,
            layout,
            source,
        )
        keys, counts = np.unique(np.stack((d_type, d_core)), axis=1, return_counts=True)
        for (ct, bid), count in zip(keys.T.tolist(), counts.tolist(), strict=True):
            dropped[(ct, bid)] = count
    columns = {
        "core_type": core_type,
        "block_id": core,
        "start_cycle": np.ascontiguousarray(records.time[begin]),
        "end_cycle": np.ascontiguousarray(records.time[end]),
        "desc_id": desc,
        "task_id": task,
        "owner_id": owner.astype(np.uint32),
        "phase": phase,
    }
    return _Spans(columns, event[begin], dropped, tasks)


def _cores(
    block: np.ndarray,
    rows: Rows,
    smid: np.ndarray | None,
    sm_of_block: np.ndarray | None,
    layout: TagLayout,
    source: str,
) -> tuple[np.ndarray, np.ndarray]:
    """``(core_type, block_id)`` of records: the SM the tag (FlashInfer) or the block's meta
    slot (Triton-distributed) names; MPK records no SM, so its block, as a CTA."""
    if smid is not None:
        return np.full(len(block), CoreType.SM, np.uint8), smid[rows].astype(np.uint32)
    if sm_of_block is None:
        return np.full(len(block), CoreType.CTA, np.uint8), block.astype(np.uint32)
    sm = sm_of_block[block]
    if np.any(sm < 0):
        raise ImportFormatError(
            f"{source}: block {int(block[np.argmax(sm < 0)])} wrote records but not its meta "
            "slot {pid, smid}: its SM is unknown"
        )
    return np.full(len(block), CoreType.SM, np.uint8), sm.astype(np.uint32)


def _aux_types(layout: TagLayout, options: ImportOptions) -> dict[str, int]:
    """Triton-distributed's auxiliary span types by name, from the names given: named
    outright, else the code generator's rule (the kernel's largest task type + 1 waits,
    + 2 decodes the next task). Empty (no waits known) without names, and for the others."""
    given = {int(k): str(v) for k, v in options.names.items()}
    if not (layout.meta_slots and given):
        return {}
    aux = {v.lower(): k for k, v in given.items() if v.lower() in AUX_NAMES}
    if WAIT_NAME not in aux:
        top = max(given)
        aux = {WAIT_NAME: top + 1, "task_decoding": top + 2}
    return aux


def _stage_names(
    layout: TagLayout, options: ImportOptions, events: np.ndarray, aux: dict[str, int]
) -> dict[int, str]:
    """Stage names of the event indices / task types seen (and of those given)."""
    given = {int(k): str(v) for k, v in options.names.items()}
    fallback = {**MPK_TASK_NAMES, **given} if layout.event_no is not None else given
    prefix = {"flashinfer": "event_", "mpk": "TASK_"}.get(layout.kernel_name, "task_")
    names = {int(e): fallback.get(int(e), f"{prefix}{int(e)}") for e in events}
    names.update(given)
    return {k: v for k, v in names.items() if k not in aux.values()}


def _next_task(writer: np.ndarray, is_aux: np.ndarray) -> np.ndarray:
    """Task numbers (the launch's spans that are tasks, writer by writer in record order);
    an auxiliary span takes the number of the next task of its writer (none: NO_TASK)."""
    n = len(writer)
    number = np.cumsum(~is_aux) - 1
    at = np.where(~is_aux, np.arange(n), n)
    following = np.minimum.accumulate(at[::-1])[::-1]
    ok = following < n
    ok[ok] = writer[following[ok]] == writer[ok]
    task = np.full(n, NO_TASK, dtype=np.uint32)
    task[ok] = number[following[ok]]
    return task


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The parts as one array; the list is emptied, so that only the result holds them."""
    joined = np.concatenate(parts)
    parts.clear()
    return joined


def _numbered(values: np.ndarray, in_time: np.ndarray) -> np.ndarray:
    """Each row's number among the rows of its value, in the order ``in_time``."""
    # Small non-negative integers (16 bits where they fit, so that numpy's stable sort is
    # a radix sort) in the order of ``values``: by a table where the values' range is small.
    if len(values) and int(values.max()) < 1 << 20:
        seen = np.bincount(values) > 0
        present = np.flatnonzero(seen)
        kind = np.uint16 if len(present) <= 1 << 16 else np.uint32
        dense = (np.cumsum(seen, dtype=kind) - kind(1))[values]
    else:
        present = np.unique(values)
        dense = np.searchsorted(present, values).astype(
            np.uint16 if len(present) <= 1 << 16 else np.uint32
        )
    del values
    sizes = np.bincount(dense, minlength=len(present))
    order = in_time[np.argsort(dense[in_time], kind="stable")]  # by value, then in time
    del dense
    ranks = np.arange(len(order), dtype=np.uint32)
    ranks -= np.repeat((np.cumsum(sizes) - sizes).astype(np.uint32), sizes)
    numbers = np.empty(len(order), dtype=np.uint32)
    numbers[order] = ranks
    return numbers


def _chunks(columns: Mapping[str, np.ndarray]) -> Iterator[pa.Table]:
    """The records as tables of at most ``CHUNK_ROWS`` rows."""
    total = len(columns["start_cycle"])
    for at in range(0, total, CHUNK_ROWS):
        part = {name: values[at : at + CHUNK_ROWS] for name, values in columns.items()}
        phase = phase_column(part.pop("phase"))
        yield pa.table(
            {
                **{name: pa.array(values) for name, values in part.items()},
                "phase": phase,
            }
        )
