"""HazyResearch Megakernels' timings: the v1 pickle of ``scripts/diff_test.py --outfile`` and
the ``.mkprof`` file of ``megakernels/timings.py``, as store records.

Each instruction owns 128 int32 timing slots; the slot index is the event. Two layouts:

- **v1** (``main``): clock64 cycles since the CTA's own start. Slots 0 controller start,
  3 semaphores set, 4 controller end, 5/6 loader, 7/8 launcher, 9/10 storer start/end,
  11+2w/12+2w consumer warp w, 44/45 gmem wait at/done, 46/47 gmem store at/done.
- **throughput** (the ``throughput`` branch, and every ``.mkprof``): globaltimer ns since
  the CTA's start, the low 4 bits an event type. Slot 0 opcode, 1 worker (SM) id, 5/6/7
  controller start/ready/cleanup, 8/9 loader, 10/11 launcher, 12/13 consumer, 14/15 storer.

Records, per recorded instruction (a task: ``task_id`` its flat position in the producer's
[SM, queue] tensor, or its global-queue index): one compute record of the whole
instruction (its first recorded start to its last recorded end; desc id = opcode), one per
unit (desc id = opcode + 0x1000 x unit: controller setup, loader, launcher, consumer, storer,
gmem store; v1 consumer warps one each, owner = warp) and the gmem wait (desc 0x10000,
phase wait). A slot 0 is not recorded: a pair missing either end writes no record. Both
clocks restart at each CTA's start, so the clock domain is ``per_core``.

Pickles are read by a restricted unpickler: numpy arrays, torch tensors (decoded here,
without torch), plain containers and inert stand-ins for the producer's own ``megakernels``
classes; any other global is refused before anything runs.
"""

from __future__ import annotations

import io
import json
import pickle
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from multicore_profiler.abi import DESC_WAIT_DEPENDENCY, NO_OWNER, CoreType
from multicore_profiler.errors import ImportFormatError
from multicore_profiler.ingest.imported import ImportedInvocation, phase_column
from multicore_profiler.ingest.imports import ImportOptions
from multicore_profiler.ingest.mapped_file import MappedFile

MKPROF_MAGIC = b"MKPROF1.2\n"
TIMING_WIDTH = 128
INSTRUCTION_WIDTH = 32
DEFAULT_FREQUENCY_HZ = 1.8e9
"""v1's clock64 frequency where the user gives none: the 1800 MHz the producer's own plot
scripts assume (``CYCLE_FREQ_MHZ``)."""
UNIT_STRIDE = 0x1000
"""A unit's desc id is its instruction's opcode + UNIT_STRIDE x its unit number."""
UNITS = ("", "controller", "loader", "launcher", "consumer", "storer", "gmem_store")
"""Unit numbers and the suffix of their stage names (0: the whole instruction)."""
CHUNK_INSTRUCTIONS = 1 << 16
"""Instructions per record chunk (at most 23 records each)."""
_WAIT = -1


@dataclass(frozen=True)
class Layout:
    """Where one producer generation writes its slot pairs: (start slot, end slot, unit,
    owner) per pair (unit ``_WAIT``: the gmem wait), the end slot that closes the
    instruction only, whether slots count ns (else clock64 cycles) and the mask of a
    slot's time bits."""

    name: str
    pairs: tuple[tuple[int, int, int, int], ...]
    closing: int
    ns: bool
    time_mask: int

    @property
    def used(self) -> tuple[int, ...]:
        """The slots this layout reads (slot 0 included: the opcode in the throughput
        layout), the columns of ``_Instructions.slots``."""
        return tuple(sorted({s for p in self.pairs for s in p[:2]} | {self.closing, 0}))

    def frequency(self, options: ImportOptions) -> float:
        if self.ns:
            return 1e9
        return options.frequency_hz or DEFAULT_FREQUENCY_HZ


V1 = Layout(
    "v1",
    (
        (0, 3, 1, NO_OWNER),
        (5, 6, 2, NO_OWNER),
        (7, 8, 3, NO_OWNER),
        *((11 + 2 * w, 12 + 2 * w, 4, w) for w in range(16)),
        (9, 10, 5, NO_OWNER),
        (46, 47, 6, NO_OWNER),
        (44, 45, _WAIT, NO_OWNER),
    ),
    closing=4,
    ns=False,
    time_mask=0xFFFFFFFF,
)
THROUGHPUT = Layout(
    "throughput",
    (
        (5, 6, 1, NO_OWNER),
        (8, 9, 2, NO_OWNER),
        (10, 11, 3, NO_OWNER),
        (12, 13, 4, NO_OWNER),
        (14, 15, 5, NO_OWNER),
    ),
    closing=7,
    ns=True,
    time_mask=0xFFFFFFF0,
)


def read(path: Path, options: ImportOptions) -> Iterator[ImportedInvocation]:
    """The launches of one pickle (one launch) or ``.mkprof`` file (one per GPU)."""
    with path.open("rb") as file:
        head = file.read(len(MKPROF_MAGIC))
    if head == MKPROF_MAGIC:
        yield from _read_mkprof(path, options)
    elif head[:1] == b"\x80":
        yield _read_pickle(path, options)
    else:
        raise ImportFormatError(
            f"{path}: neither a .mkprof file (magic {MKPROF_MAGIC!r}) nor a pickle"
        )


# ---- the timings of whole cores as records


@dataclass(frozen=True)
class _Instructions:
    """Recorded instructions of whole cores, sorted by core: their core (block id), task id,
    opcode and the timing slots their layout reads (``Layout.used``; int64, as recorded)."""

    block: np.ndarray
    task: np.ndarray
    opcode: np.ndarray
    slots: np.ndarray


def _records(found: _Instructions, layout: Layout, where: str, counter: dict[int, int]) -> pa.Table:
    """The records of these instructions, each core's in time order. ``counter`` carries
    each desc id's record count across chunks (``stage_task_index``)."""
    slots, used = found.slots, layout.used
    negative = slots < 0
    if negative.any():
        row, col = np.argwhere(negative)[0]
        raise ImportFormatError(
            f"{where}: SM {found.block[row]}, instruction {found.task[row]}: slot {used[col]} "
            f"holds a negative time {slots[row, col]}"
        )
    times = slots & layout.time_mask
    pairs = np.array([p[:2] for p in layout.pairs])
    start_cols = np.searchsorted(used, pairs[:, 0])
    end_cols = np.searchsorted(used, pairs[:, 1])
    starts, ends = times[:, start_cols], times[:, end_cols]
    recorded = (slots[:, start_cols] != 0) & (slots[:, end_cols] != 0)
    backwards = recorded & (ends < starts)
    if backwards.any():
        row, pair = np.argwhere(backwards)[0]
        start_slot, end_slot = pairs[pair]
        raise ImportFormatError(
            f"{where}: SM {found.block[row]}, instruction {found.task[row]}: slot "
            f"{end_slot} ({ends[row, pair]}) ends before slot {start_slot} "
            f"({starts[row, pair]}) starts"
        )
    close_slot = layout.closing
    close_col = used.index(close_slot)
    closing = times[:, close_col]
    big = np.iinfo(np.int64).max
    first = np.where(recorded, starts, big).min(axis=1)
    last = np.maximum(np.where(recorded, ends, -1).max(axis=1), closing)
    whole = recorded.any(axis=1)
    early = whole & (slots[:, close_col] != 0) & (closing < first)
    if early.any():
        row = np.flatnonzero(early)[0]
        raise ImportFormatError(
            f"{where}: SM {found.block[row]}, instruction {found.task[row]}: slot {close_slot} "
            f"({closing[row]}), which closes it, lies before its first start ({first[row]})"
        )
    # Column 0: the whole instruction, then its pairs; row by row, each row's records in
    # column order, which is often time order on each core already.
    units = np.array([0, *(p[2] for p in layout.pairs)])
    owners = np.array([NO_OWNER, *(p[3] for p in layout.pairs)], np.uint32)
    row, col = np.nonzero(np.column_stack((whole, recorded)))
    start = np.column_stack((first, starts))[row, col]
    end = np.column_stack((last, ends))[row, col]
    unit, owner = units[col], owners[col]
    wait = unit == _WAIT
    desc = np.where(wait, DESC_WAIT_DEPENDENCY, found.opcode[row] + UNIT_STRIDE * unit)
    block = found.block[row]
    # Time order per core; at one start the whole instruction before its units.
    order = _lexsorted((np.where(wait, len(UNITS), unit), found.task[row], start, block))
    if order is not None:
        block, row, start, end, desc, owner, wait = (
            a[order] for a in (block, row, start, end, desc, owner, wait)
        )
    first_of_core = np.r_[0, np.flatnonzero(np.diff(block)) + 1]
    index = np.arange(len(block)) - np.repeat(
        first_of_core, np.diff(np.r_[first_of_core, len(block)])
    )
    return pa.table(
        {
            "core_type": pa.array(np.full(len(block), CoreType.SM, np.uint8)),
            "block_id": pa.array(block.astype(np.uint32)),
            "record_index": pa.array(index.astype(np.uint32)),
            "start_cycle": pa.array(start.astype(np.uint64)),
            "end_cycle": pa.array(end.astype(np.uint64)),
            "desc_id": pa.array(desc.astype(np.uint32)),
            "task_id": pa.array(found.task[row].astype(np.uint32)),
            "stage_task_index": pa.array(_stage_indices(desc, counter)),
            "owner_id": pa.array(owner),
            "phase": phase_column(wait),  # 1: a wait, 0: compute
        }
    )


def _lexsorted(keys: tuple[np.ndarray, ...]) -> np.ndarray | None:
    """``np.lexsort(keys)`` (last key first) of integer keys, by one stable sort of the
    keys packed into an int64 where their ranges fit 63 bits; None where the rows are in
    that order already."""
    if not len(keys[0]):
        return None
    lows = [int(k.min()) for k in keys]
    bits = [(int(k.max()) - low).bit_length() for k, low in zip(keys, lows, strict=True)]
    if sum(bits) > 63:
        return np.lexsort(keys)
    packed = np.zeros(len(keys[0]), np.int64)
    shift = 0
    for key, low, width in zip(keys, lows, bits, strict=True):
        packed |= (key.astype(np.int64) - low) << shift
        shift += width
    if np.all(packed[1:] >= packed[:-1]):
        return None
    return np.argsort(packed, kind="stable")


def _stage_indices(desc: np.ndarray, counter: dict[int, int]) -> np.ndarray:
    """Each record's number among the records of its desc id so far (the chunks before
    included, through ``counter``)."""
    if len(desc) and int(desc.min()) >= 0 and int(desc.max()) < 1 << 20:
        # Desc ids are few and small: dense 16-bit codes sort by radix.
        sizes = np.bincount(desc)
        ids = np.flatnonzero(sizes)
        counts = sizes[ids]
        code = np.uint16 if len(ids) <= 1 << 16 else np.uint32
        order = np.argsort((np.cumsum(sizes > 0, dtype=code) - code(1))[desc], kind="stable")
        first = np.cumsum(counts) - counts
    else:
        order = np.argsort(desc, kind="stable")
        ids, first, counts = np.unique(desc[order], return_index=True, return_counts=True)
    base = np.array([counter.get(int(i), 0) for i in ids], np.int64)
    within = np.arange(len(desc)) - np.repeat(first, counts) + np.repeat(base, counts)
    for i, c in zip(ids.tolist(), counts.tolist(), strict=True):
        counter[i] = counter.get(i, 0) + c
    out = np.empty(len(desc), np.uint32)
    out[order] = within
    return out


def _stage_names(opcodes: np.ndarray, layout: Layout, names: Mapping[int, str]) -> dict[int, str]:
    """Each opcode's stages: its name (given, else ``op_<n>``) and ``<name>.<unit>``."""
    units = sorted({p[2] for p in layout.pairs if p[2] != _WAIT})
    stages = {}
    for op in np.unique(opcodes).tolist():
        name = names.get(op, f"op_{op}")
        stages[op] = name
        stages.update({op + UNIT_STRIDE * u: f"{name}.{UNITS[u]}" for u in units})
    return stages


def _check_opcodes(opcode: np.ndarray, where: str) -> None:
    bad = (opcode < 0) | (opcode >= UNIT_STRIDE)
    if bad.any():
        raise ImportFormatError(
            f"{where}: opcode {opcode[bad][0]} lies outside 0..{UNIT_STRIDE - 1}"
        )


def _invocation(
    source: str,
    options: ImportOptions,
    layout: Layout,
    producer_format: str,
    chunks: Iterator[_Instructions],
    opcodes: np.ndarray,
    names: Mapping[int, str],
    rank: int,
    device: int,
) -> ImportedInvocation:
    counter: dict[int, int] = {}
    return ImportedInvocation(
        kernel_name=options.kernel_name or "megakernel",
        frequency_hz=layout.frequency(options),
        producer="hazy",
        producer_format=producer_format,
        records=(_records(c, layout, source, counter) for c in chunks),
        source=source,
        clock_domain="per_core",
        stage_names=_stage_names(opcodes, layout, {**names, **options.names}),
        owner_label="warp" if layout is V1 else None,
        rank=rank,
        device=device,
    )


# ---- the v1 pickle


def _read_pickle(path: Path, options: ImportOptions) -> ImportedInvocation:
    with path.open("rb") as file:
        data = _load_pickle(file, str(path))
    if not isinstance(data, dict) or not {"timings", "instructions"} <= data.keys():
        raise ImportFormatError(
            f"{path}: a timings pickle is a dict with 'timings' and 'instructions'"
        )
    timings, words = data["timings"], data["instructions"]
    for key, array, width in (
        ("timings", timings, TIMING_WIDTH),
        ("instructions", words, INSTRUCTION_WIDTH),
    ):
        if not (
            isinstance(array, np.ndarray)
            and np.issubdtype(array.dtype, np.integer)
            and array.ndim in (2, 3)
            and array.shape[-1] == width
        ):
            raise ImportFormatError(
                f"{path}: '{key}' must be an integer array [..., {width}], got "
                f"{getattr(array, 'dtype', type(array).__name__)} {getattr(array, 'shape', '')}"
            )
    if timings.shape[:-1] != words.shape[:-1]:
        raise ImportFormatError(
            f"{path}: 'timings' {timings.shape} and 'instructions' {words.shape} disagree on "
            "their SMs and instructions"
        )
    flat = timings.reshape(-1, TIMING_WIDTH)
    opcode = words[..., 0].astype(np.int64).reshape(-1)
    if timings.ndim == 2:  # the throughput branch's global work queue: worker in slot 1
        layout, block = THROUGHPUT, flat[:, 1].astype(np.int64)
        task = np.arange(len(flat))
    else:
        layout = V1 if (timings[..., 2:5] != 0).any() else THROUGHPUT
        sms, queue = timings.shape[:2]
        block = np.repeat(np.arange(sms), queue)
        task = np.arange(sms * queue)
    where = f"{path} ({layout.name} timings)"
    slots = flat[:, layout.used].astype(np.int64)
    keep = _started(slots, layout)
    if layout is THROUGHPUT:
        _check_throughput_meta(slots[keep, 0], opcode[keep], task[keep], where)
        if timings.ndim == 2 and (block[keep] < 0).any():
            raise ImportFormatError(f"{where}: a negative worker id in slot 1")
    found = _sorted(block[keep], task[keep], opcode[keep], slots[keep])
    if not len(found.block):
        raise ImportFormatError(f"{path}: no instruction has a recorded timing")
    _check_opcodes(found.opcode, where)
    return _invocation(
        str(path),
        options,
        layout,
        f"timings-pickle:{layout.name}",
        _split(found),
        found.opcode,
        _class_names(data.get("python_instructions"), words),
        options.rank or 0,
        0,
    )


def _started(slots: np.ndarray, layout: Layout) -> np.ndarray:
    """Which instructions recorded any start (the others were never run, or are padding)."""
    starts = np.searchsorted(layout.used, [p[0] for p in layout.pairs])
    return (slots[:, starts] != 0).any(axis=1)


def _check_throughput_meta(
    slot0: np.ndarray, opcode: np.ndarray, task: np.ndarray, where: str
) -> None:
    """Slot 0 of the throughput layout repeats the instruction's opcode: a file whose slot 0
    says otherwise is not of this layout."""
    bad = slot0 != opcode
    if bad.any():
        at = np.flatnonzero(bad)[0]
        raise ImportFormatError(
            f"{where}: instruction {task[at]}: slot 0 ({slot0[at]}) is not its opcode "
            f"({opcode[at]})"
        )


def _sorted(
    block: np.ndarray, task: np.ndarray, opcode: np.ndarray, slots: np.ndarray
) -> _Instructions:
    order = np.lexsort((task, block))
    return _Instructions(block[order], task[order], opcode[order], slots[order])


def _split(found: _Instructions) -> Iterator[_Instructions]:
    """Chunks of whole cores, about CHUNK_INSTRUCTIONS instructions each (a larger core is
    a chunk of its own)."""
    count = len(found.block)
    core_ends = np.r_[np.flatnonzero(np.diff(found.block)) + 1, count]
    lo = 0
    while lo < count:
        ends = core_ends[core_ends > lo]
        fit = ends[ends <= lo + CHUNK_INSTRUCTIONS]
        hi = int(fit[-1] if len(fit) else ends[0])
        yield _Instructions(
            *(a[lo:hi] for a in (found.block, found.task, found.opcode, found.slots))
        )
        lo = hi


def _class_names(python_instructions: object, words: np.ndarray) -> dict[int, str]:
    """Opcode -> the class name of the producer's own instruction objects
    (``python_instructions[sm][i]``), where they line up with the instruction words and
    each opcode has one class."""
    if words.ndim != 3 or not isinstance(python_instructions, list):
        return {}
    seen: dict[int, set[str]] = {}
    for sm, queue in enumerate(python_instructions[: words.shape[0]]):
        if not isinstance(queue, list):
            return {}
        for i, instruction in enumerate(queue[: words.shape[1]]):
            if isinstance(instruction, _ProducerObject):
                seen.setdefault(int(words[sm, i, 0]), set()).add(type(instruction).__name__)
    return {op: next(iter(n)) for op, n in seen.items() if len(n) == 1}


class _ProducerObject:
    """An inert stand-in for an object of the producer's own package (its instruction
    dataclasses): it keeps what the pickle gives it and runs nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args = args

    def __setstate__(self, state: object) -> None:
        self.state = state


_STAND_INS: dict[tuple[str, str], type] = {}
_PRODUCER_PACKAGES = ("megakernels", "megakittens")


def _stand_in(module: str, name: str) -> type:
    key = (module, name)
    if key not in _STAND_INS:
        _STAND_INS[key] = type(name, (_ProducerObject,), {"__module__": module})
    return _STAND_INS[key]


def _encode_latin1(text: str, encoding: str) -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes, and nothing more."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}")
    return text.encode("latin1")


def _numpy_globals() -> dict[tuple[str, str], object]:
    """numpy's own array and scalar rebuilders, under their numpy 1 and 2 module names."""
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # numpy 1
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    allowed: dict[tuple[str, str], object] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for package in ("numpy.core", "numpy._core"):
        allowed[f"{package}.multiarray", "_reconstruct"] = multiarray._reconstruct
        allowed[f"{package}.multiarray", "scalar"] = multiarray.scalar
        allowed[f"{package}.numeric", "_frombuffer"] = numeric._frombuffer
    return allowed


class _Unpickler(pickle.Unpickler):
    """Plain containers, numpy arrays, torch tensors (as numpy arrays) and stand-ins for the
    producer's classes; any other global is refused."""

    def __init__(self, file: io.BufferedIOBase, where: str) -> None:
        super().__init__(file)
        self.where = where
        self.allowed = {
            **_numpy_globals(),
            ("collections", "OrderedDict"): OrderedDict,
            ("_codecs", "encode"): _encode_latin1,
            ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
            ("torch.storage", "_load_from_bytes"): lambda b: _load_storage(b, where),
        }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in self.allowed:
            return self.allowed[module, name]
        if module.split(".")[0] in _PRODUCER_PACKAGES:
            return _stand_in(module, name)
        raise ImportFormatError(
            f"{self.where}: the pickle names {module}.{name}, which a timings pickle never "
            "holds; it is not unpickled"
        )


def _load_pickle(file: io.BufferedIOBase, where: str) -> object:
    try:
        return _Unpickler(file, where).load()
    except ImportFormatError:
        raise
    except Exception as error:  # a damaged pickle fails in any of pickle's own ways
        raise ImportFormatError(f"{where}: not a readable pickle ({error})") from None


_STORAGE_DTYPES = {
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


class _StorageUnpickler(pickle.Unpickler):
    """The inner pickle of a pickled torch storage (torch's legacy save format): it names a
    storage class and refers to the storage's bytes by key."""

    def __init__(self, file: io.BytesIO, where: str) -> None:
        super().__init__(file)
        self.where = where
        self.storages: dict[str, tuple[np.dtype, int]] = {}

    def find_class(self, module: str, name: str) -> object:
        if module == "torch" and name in _STORAGE_DTYPES:
            return np.dtype(_STORAGE_DTYPES[name])
        raise ImportFormatError(
            f"{self.where}: a pickled tensor names {module}.{name}, which is no plain storage"
        )

    def persistent_load(self, pid: object) -> object:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise ImportFormatError(f"{self.where}: a pickled tensor refers to {pid!r}")
        _, dtype, key, _location, numel, *view = pid
        if view and view[0] is not None:
            raise ImportFormatError(f"{self.where}: a pickled tensor is a view of a storage")
        self.storages[str(key)] = (dtype, int(numel))
        return str(key)


def _load_storage(blob: bytes, where: str) -> np.ndarray:
    """A torch storage pickled as ``torch.storage._load_from_bytes(blob)``, as a flat numpy
    array: the legacy save format (magic, protocol, system info, the storage's pickle, its
    keys, then per key an int64 element count and the elements)."""
    file = io.BytesIO(blob)
    inner = _StorageUnpickler(file, where)
    if inner.load() != _LEGACY_MAGIC or inner.load() != _LEGACY_PROTOCOL:
        raise ImportFormatError(f"{where}: a pickled tensor's storage is of an unknown format")
    info = inner.load()
    if not (isinstance(info, dict) and info.get("little_endian")):
        raise ImportFormatError(f"{where}: a pickled tensor's storage is not little-endian")
    key = inner.load()
    keys = inner.load()
    if keys != [key] or key not in inner.storages:
        raise ImportFormatError(f"{where}: a pickled tensor's storage lists keys {keys!r}")
    dtype, numel = inner.storages[key]
    count = np.frombuffer(file.read(8), "<i8")
    data = file.read(numel * dtype.itemsize)
    if len(count) != 1 or count[0] != numel or len(data) != numel * dtype.itemsize:
        raise ImportFormatError(f"{where}: a pickled tensor's storage is truncated")
    return np.frombuffer(data, dtype.newbyteorder("<"))


def _rebuild_tensor(
    storage: np.ndarray,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    *_: object,
) -> np.ndarray:
    """``torch._utils._rebuild_tensor_v2`` over a storage decoded by ``_load_storage``: a
    copy of the strided view, its bounds checked."""
    if not isinstance(storage, np.ndarray):
        raise pickle.UnpicklingError("a tensor without a storage")
    if any(n == 0 for n in size):
        return np.zeros(size, storage.dtype)
    reach = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if offset < 0 or min(stride, default=0) < 0 or reach >= len(storage):
        raise pickle.UnpicklingError("a tensor reaches beyond its storage")
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=[s * storage.itemsize for s in stride]
    )
    return np.array(view)


# ---- the .mkprof file


def _read_mkprof(path: Path, options: ImportOptions) -> Iterator[ImportedInvocation]:
    config, offset = _mkprof_header(path)
    gpus, processors, per_instruction = (
        _config_int(config, key, path)
        for key in ("num_gpus", "total_processors", "max_instructions")
    )
    cells = processors * per_instruction
    size = path.stat().st_size
    expected = offset + cells * 4 * (INSTRUCTION_WIDTH + 2 + TIMING_WIDTH)
    if size != expected:
        raise ImportFormatError(
            f"{path}: the header's {processors} processors x {per_instruction} instructions "
            f"need {expected} bytes, the file has {size}"
            + (" (truncated)" if size < expected else "")
        )
    if gpus < 1 or processors % gpus:
        raise ImportFormatError(
            f"{path}: {processors} processors do not split evenly over {gpus} GPUs; which SM "
            "belongs to which GPU is not in the file"
        )
    arrays = _MkprofArrays(
        path,
        offset,
        offset + cells * 4 * (INSTRUCTION_WIDTH + 2),
        per_instruction,
        MappedFile(path),
    )
    names = {
        int(k): str(v["name"])
        for k, v in (config.get("instruction_types") or {}).items()
        if str(k).lstrip("-").isdigit() and isinstance(v, dict) and "name" in v
    }
    sms = processors // gpus
    for gpu in range(gpus):
        where = f"{path} (GPU {gpu})"
        spans = arrays.spans(gpu * sms, (gpu + 1) * sms)
        # Each span's distinct opcodes: memory holds one span's opcodes at a time.
        opcodes = np.unique(np.concatenate([np.unique(arrays.opcodes(lo, hi)) for lo, hi in spans]))
        yield _invocation(
            where,
            options,
            THROUGHPUT,
            "mkprof:1.2",
            _mkprof_chunks(arrays, gpu * sms, spans, where),
            opcodes[(opcodes >= 0) & (opcodes < UNIT_STRIDE)],
            names,
            (options.rank or 0) + gpu,
            gpu,
        )


@dataclass(frozen=True)
class _MkprofArrays:
    """Where a ``.mkprof``'s instruction words and events lie. Each read copies some columns
    of whole processors out of the file's map and releases its pages, so that memory holds
    those columns of a chunk, not the file."""

    path: Path
    words_at: int
    events_at: int
    queue: int
    mapped: MappedFile

    def spans(self, first: int, end: int) -> list[tuple[int, int]]:
        """Processors first..end in runs of about CHUNK_INSTRUCTIONS instructions."""
        step = max(1, CHUNK_INSTRUCTIONS // max(1, self.queue))
        return [(lo, min(end, lo + step)) for lo in range(first, end, step)]

    def opcodes(self, lo: int, hi: int) -> np.ndarray:
        """Processors lo..hi's opcodes (word 0 of their [instructions, 32] int32 words)."""
        return self._read(self.words_at, lo, hi, INSTRUCTION_WIDTH, [0])[:, 0]

    def events(self, lo: int, hi: int, columns: Sequence[int]) -> np.ndarray:
        """Processors lo..hi's events' ``columns`` (of [instructions, 128]): uint32 in the
        file, read as the device's int32 (a time in the upper half is negative)."""
        return self._read(self.events_at, lo, hi, TIMING_WIDTH, columns)

    def _read(self, at: int, lo: int, hi: int, width: int, columns: Sequence[int]) -> np.ndarray:
        count = (hi - lo) * self.queue * width
        offset = at + lo * self.queue * width * 4
        values = self.mapped.array("<i4", offset, count).reshape(-1, width)[:, list(columns)]
        self.mapped.release()  # copied by the column selection
        return values


def _mkprof_header(path: Path) -> tuple[dict, int]:
    """The config and the offset of the arrays (after 0-3 pad bytes to a 4-byte boundary).
    The compact JSON ends where its top-level object closes."""
    with path.open("rb") as file:
        head = file.read(1 << 20)
    decoder = json.JSONDecoder()
    text = head[len(MKPROF_MAGIC) :].decode("utf-8", "replace")
    try:
        config, used = decoder.raw_decode(text)
    except json.JSONDecodeError as error:
        raise ImportFormatError(
            f"{path}: the config after the magic line is not JSON ({error})"
        ) from None
    if not isinstance(config, dict):
        raise ImportFormatError(f"{path}: the config is not a JSON object")
    end = len(MKPROF_MAGIC) + len(text[:used].encode("utf-8"))
    return config, end + (-end) % 4


def _config_int(config: dict, key: str, path: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ImportFormatError(f"{path}: the config's {key!r} is {value!r}, not a count")
    return value


def _mkprof_chunks(
    arrays: _MkprofArrays, first: int, spans: list[tuple[int, int]], where: str
) -> Iterator[_Instructions]:
    """One GPU's recorded instructions, a span of whole SMs at a time (SMs numbered from
    the GPU's first processor)."""
    queue = arrays.queue
    for lo, hi in spans:
        slots = arrays.events(lo, hi, THROUGHPUT.used).astype(np.int64)
        opcode = arrays.opcodes(lo, hi).astype(np.int64)
        block = np.repeat(np.arange(lo - first, hi - first), queue)
        task = np.arange((lo - first) * queue, (hi - first) * queue)
        keep = _started(slots, THROUGHPUT)
        if keep.any():
            _check_throughput_meta(slots[keep, 0], opcode[keep], task[keep], where)
            found = _Instructions(block[keep], task[keep], opcode[keep], slots[keep])
            _check_opcodes(found.opcode, where)
            yield found
