"""HazyResearch Megakernels' timing files, packed as the producer writes them (there are no
public samples): the pickle of ``scripts/diff_test.py --outfile`` ({timings, instructions,
python_instructions, cost_per_sm}, torch tensors or numpy arrays) and the ``.mkprof`` file
of ``megakernels/timings.py`` (magic line, compact JSON config, pad to 4 bytes, int32
instructions, uint32 start (slot 6) and end (slot 7), uint32 events).

Also ``write_synthetic`` (a large ``.mkprof`` for the benchmark) and ``numpy_decode``, the
plain numpy baseline: a memory map and slot slices, no pairing and no checks.
"""

from __future__ import annotations

import json
import pickle
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

MAGIC = b"MKPROF1.2\n"
TIMING_WIDTH = 128
INSTRUCTION_WIDTH = 32
INSTRUCTIONS_MODULE = "megakernels.demos.latency.instructions"

THROUGHPUT_UNITS = {"controller": (5, 6), "loader": (8, 9), "launcher": (10, 11)}
THROUGHPUT_UNITS |= {"consumer": (12, 13), "storer": (14, 15)}


def timings(sms: int, queue: int, slots: Mapping[tuple[int, int], Mapping[int, int]]) -> np.ndarray:
    """An int32 [sms, queue, 128] timings tensor: ``slots[(sm, i)] = {slot: value}``; every
    other slot 0 (not recorded)."""
    out = np.zeros((sms, queue, TIMING_WIDTH), np.int32)
    for (sm, i), values in slots.items():
        for slot, value in values.items():
            out[sm, i, slot] = value
    return out


def instructions(sms: int, queue: int, opcodes: Mapping[tuple[int, int], int]) -> np.ndarray:
    """An int32 [sms, queue, 32] instructions tensor: word 0 the opcode, word 1 a layer."""
    out = np.zeros((sms, queue, INSTRUCTION_WIDTH), np.int32)
    for (sm, i), opcode in opcodes.items():
        out[sm, i, 0] = opcode
        out[sm, i, 1] = 7
    return out


@contextmanager
def _producer_module() -> Iterator[types.ModuleType]:
    """The producer's instruction module, so that pickle finds its classes by name as it
    does in the producer's process."""
    parts = INSTRUCTIONS_MODULE.split(".")
    names = [".".join(parts[: n + 1]) for n in range(len(parts))]
    modules = [types.ModuleType(name) for name in names]
    sys.modules.update(zip(names, modules, strict=True))
    try:
        yield modules[-1]
    finally:
        for name in names:
            del sys.modules[name]


def instruction_class(module: types.ModuleType, name: str) -> type:
    """A dataclass-like instruction class of the producer's module."""
    cls = type(name, (), {"__module__": INSTRUCTIONS_MODULE})
    setattr(module, name, cls)
    return cls


def write_pickle(
    path: Path,
    timings: np.ndarray,
    words: np.ndarray,
    *,
    classes: Sequence[Sequence[str]] | None = None,
    cost_per_sm: list[float] | None = None,
    tensors: bool = True,
    protocol: int = pickle.DEFAULT_PROTOCOL,
) -> Path:
    """The pickle ``diff_test.py --outfile`` writes: torch tensors (``.cpu()``) or numpy
    arrays, ``python_instructions`` as the producer's instruction objects named by
    ``classes[sm][i]``."""
    if tensors:
        import torch

        timings, words = torch.from_numpy(timings), torch.from_numpy(words)
    with _producer_module() as module:
        made: dict[str, type] = {}
        queues = []
        for names in classes or []:
            queue = []
            for i, name in enumerate(names):
                cls = made.get(name) or instruction_class(module, name)
                made[name] = cls
                obj = cls()
                obj.__dict__.update({"layer_idx": 7, "index": i})
                queue.append(obj)
            queues.append(queue)
        data = {
            "timings": timings,
            "instructions": words,
            "python_instructions": queues,
            "cost_per_sm": cost_per_sm,
        }
        path.write_bytes(pickle.dumps(data, protocol=protocol))
    return path


def config(
    names: Mapping[int, str], *, num_gpus: int, total_processors: int, max_instructions: int
) -> dict:
    """The writer's config (``get_default_config`` of ``timings.py``, trimmed)."""
    return {
        "format_version": "1.2",
        "instruction_types": {
            str(op): {"name": name, "color": "#808080", "params": {"1": "layer_idx"}}
            for op, name in names.items()
        },
        "instruction_format": {"instruction_length": 32, "timing_length": 128},
        "functional_units": {
            "0": {
                "name": "Loader",
                "event_range": {"start": 16, "end": 47},
                "height_multiplier": 1.0,
                "special_events": {"start": 8, "end": 9},
            },
            "1": {
                "name": "Consumer",
                "event_range": {"start": 48, "end": 79},
                "height_multiplier": 2.0,
                "special_events": {"start": 12, "end": 13},
            },
            "2": {
                "name": "Storer",
                "event_range": {"start": 112, "end": 127},
                "height_multiplier": 1.0,
                "special_events": {"start": 14, "end": 15},
            },
            "3": {
                "name": "Launcher",
                "event_range": {"start": 80, "end": 111},
                "height_multiplier": 1.0,
                "special_events": {"start": 10, "end": 11},
            },
        },
        "main_functional_unit": 1,
        "event_types": {"7": {"name": "WAIT_EVENT", "color": "#ff0000"}},
        "controller_events": {
            "5": {"name": "CONTROLLER_START", "color": "#FA8072"},
            "6": {"name": "CONTROLLER_READY", "color": "#32CD32"},
            "7": {"name": "CONTROLLER_CLEANUP", "color": "#FFFFFF"},
        },
        "num_gpus": num_gpus,
        "total_processors": total_processors,
        "max_instructions": max_instructions,
        "time_unit_flag": 1,
        "has_events_flag": 1,
    }


def write_mkprof(
    path: Path,
    events: np.ndarray,
    words: np.ndarray,
    *,
    names: Mapping[int, str] | None = None,
    num_gpus: int = 1,
    header: Mapping[str, object] | None = None,
) -> Path:
    """A ``.mkprof`` of [processors, instructions, 128] events and [.., 32] instruction
    words, processors of all GPUs in order; ``header`` overrides config keys."""
    processors, count = events.shape[:2]
    cfg = config(
        names or {}, num_gpus=num_gpus, total_processors=processors, max_instructions=count
    )
    cfg.update(header or {})
    events = events.astype(np.uint32)
    head = MAGIC + json.dumps(cfg, separators=(",", ":")).encode()
    head += b"\0" * (-len(head) % 4)
    with path.open("wb") as file:
        file.write(head)
        file.write(words.astype(np.int32).tobytes())
        file.write(np.ascontiguousarray(events[..., 6]).tobytes())
        file.write(np.ascontiguousarray(events[..., 7]).tobytes())
        file.write(events.tobytes())
    return path


def write_synthetic(path: Path, records: int, *, processors: int = 132) -> int:
    """A throughput ``.mkprof`` of one GPU whose import gives about ``records`` records
    (6 per instruction: the instruction, controller, loader, launcher, consumer, storer);
    return the exact number it gives. Written a block of SMs at a time."""
    per_sm = max(1, -(-records // (6 * processors)))
    step = 1024
    cfg = config(
        {1: "Matvec", 2: "Attention"},
        num_gpus=1,
        total_processors=processors,
        max_instructions=per_sm,
    )
    head = MAGIC + json.dumps(cfg, separators=(",", ":")).encode()
    head += b"\0" * (-len(head) % 4)
    i = np.arange(per_sm, dtype=np.int64)
    opcode = (1 + i % 2).astype(np.int32)
    base = 1024 + i * step
    one = np.zeros((per_sm, TIMING_WIDTH), np.uint32)
    one[:, 0] = opcode
    for offset, slot in enumerate((5, 6, 8, 10, 12, 9, 11, 13, 14, 15, 7)):
        one[:, slot] = base + 64 * (offset + 1) * (slot != 5) + 16 * (slot == 5)
    words = np.zeros((per_sm, INSTRUCTION_WIDTH), np.int32)
    words[:, 0] = opcode
    with path.open("wb") as file:
        file.write(head)
        for _ in range(processors):
            file.write(words.tobytes())
        for column in (6, 7):
            for _ in range(processors):
                file.write(np.ascontiguousarray(one[:, column]).tobytes())
        for sm in range(processors):
            one[:, 1] = sm
            file.write(one.tobytes())
    return 6 * per_sm * processors


def numpy_decode(path: Path) -> dict[str, np.ndarray]:
    """The plain numpy baseline of reading a ``.mkprof``: memory-map the events and slice
    each unit's start and end slots (throughput layout), no pairing, no checks."""
    with path.open("rb") as file:
        head = file.read(1 << 20)
    cfg, used = json.JSONDecoder().raw_decode(head[len(MAGIC) :].decode("latin1"))
    offset = len(MAGIC) + used
    offset += -offset % 4
    cells = cfg["total_processors"] * cfg["max_instructions"]
    events = np.memmap(path, np.uint32, "r", offset + cells * 4 * 34, (cells, TIMING_WIDTH))
    out = {"opcode": np.asarray(events[:, 0])}
    for unit, (start, end) in THROUGHPUT_UNITS.items():
        out[f"{unit}_start"] = np.asarray(events[:, start]) & 0xFFFFFFF0
        out[f"{unit}_end"] = np.asarray(events[:, end]) & 0xFFFFFFF0
    return out
