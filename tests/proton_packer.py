"""Triton Proton's artefacts, written as Proton writes them, for the import tests and bench.

- ``pack_buffer``: an instrumentation host buffer (``InstrumentationHook._populate_host_buffer``
  and the device's circular store: entry k of a warp goes to slot k mod capacity, and the
  warp's word count keeps counting);
- ``chrome_trace``: the ``.chrome_trace`` Proton writes from such a buffer: its parser
  (``CircularLayoutParser``: each segment read from slot 0 in buffer order, a begin after a
  begin of the same scope ignored, an end without a begin ignored, a begin after its end
  dropped) and ``StreamChromeTraceWriter`` (nlohmann's sorted keys, ts and dur in µs at an
  assumed 1 GHz, each CTA moved by its init time and its first cycle);
- ``write_synthetic``: a large host buffer for the benchmark, and ``numpy_decode``, the
  plain numpy decode of its entries (no pairing) that the benchmark compares against.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PREAMBLE = 0xDEADBEEF
COLORS = (
    "cq_build_passed", "cq_build_failed", "thread_state_iowait", "thread_state_running",
    "thread_state_runnable", "thread_state_unknown", "rail_response", "rail_idle", "rail_load",
    "cq_build_attempt_passed", "cq_build_attempt_failed",
)  # fmt: skip


def entry(scope: int, cycle: int, end: bool) -> tuple[int, int]:
    """An entry's two words: end flag, scope id and clock bits 42..32; clock bits 31..0."""
    return (int(end) << 31) | (scope << 23) | ((cycle >> 32) & 0x7FF), cycle & 0xFFFFFFFF


def scopes(*events: tuple[str, int]) -> list[tuple[int, int, bool]]:
    """Entries from ``("S1", cycle)`` / ``("E1", cycle)`` pairs."""
    return [(int(name[1:]), cycle, name[0] == "E") for name, cycle in events]


@dataclass
class Cta:
    """A CTA block: its header and each profiled warp's entries, in the order written."""

    program: int
    hw: int
    init: int
    prefinal: int
    postfinal: int
    warps: Sequence[Sequence[tuple[int, int, bool]]] = ()
    preamble: int = PREAMBLE
    counts: Sequence[int] | None = None
    """Word counts as written (default: two per entry)."""


@dataclass
class Layout:
    """The host header's layout fields."""

    total_unit: int = 4
    uids: Sequence[int] = (0, 1, 2, 3)
    segment_bytes: int = 64
    scratch: int = 384
    device_type: int = 2
    extra_payload: int = 0
    filler: int = 0xBE
    overrides: Mapping[str, int] = field(default_factory=dict)
    """Host header fields to write as given (``version``, ``payload_size``, ...)."""


HOST_FIELDS = (
    "version", "header_offset", "header_size", "payload_offset", "payload_size", "device_type",
    "block_num", "total_unit", "scratch_mem_size", "uid_num",
)  # fmt: skip


def pack_buffer(ctas: Sequence[Cta], layout: Layout | None = None) -> bytes:
    """A host buffer of ``ctas`` (one block each, in order)."""
    layout = layout or Layout()
    uid_num = len(layout.uids)
    header_size = 40 + 4 * uid_num
    capacity = layout.segment_bytes // 8
    blocks = []
    for cta in ctas:
        block = bytearray([layout.filler]) * layout.scratch
        counts = [0] * layout.total_unit
        data = bytearray([layout.filler]) * (layout.segment_bytes * uid_num)
        for segment, entries in enumerate(cta.warps):
            for k, (scope, cycle, end) in enumerate(entries):
                at = segment * layout.segment_bytes + (k % capacity) * 8
                data[at : at + 8] = struct.pack("<2I", *entry(scope, cycle, end))
            counts[layout.uids[segment]] = 2 * len(entries)
        if cta.counts is not None:
            counts = list(cta.counts)
        head = struct.pack(
            f"<4I3Q{layout.total_unit}I", cta.preamble, cta.program, cta.hw, len(data),
            cta.init, cta.prefinal, cta.postfinal, *counts,
        )  # fmt: skip
        block[: len(head)] = head
        block[len(head) : len(head) + len(data)] = data
        blocks.append(bytes(block) if cta.preamble else bytes(layout.scratch))
    payload = b"".join(blocks) + bytes(layout.extra_payload)
    values = {
        "version": 1, "header_offset": 4, "header_size": header_size,
        "payload_offset": header_size, "payload_size": len(payload),
        "device_type": layout.device_type, "block_num": len(ctas),
        "total_unit": layout.total_unit, "scratch_mem_size": layout.scratch, "uid_num": uid_num,
        **layout.overrides,
    }  # fmt: skip
    header = struct.pack(f"<{len(HOST_FIELDS) + uid_num}I", *(values[k] for k in HOST_FIELDS),
                         *layout.uids)  # fmt: skip
    return header + payload


# --- Proton's parser and chrome trace writer ---------------------------------------------


def _parse(buffer: bytes) -> list[dict]:
    """``CircularLayoutParser``: per profiled block, per warp, the (scope, begin, end)
    events it pairs, reading each segment from slot 0."""
    fields = dict(zip(HOST_FIELDS, struct.unpack_from("<10I", buffer), strict=True))
    uids = struct.unpack_from(f"<{fields['uid_num']}I", buffer, 40)
    blocks = []
    for number in range(fields["block_num"]):
        base = fields["payload_offset"] + number * fields["scratch_mem_size"]
        preamble, program, hw, size = struct.unpack_from("<4I", buffer, base)
        if preamble == 0:
            continue
        init, prefinal, postfinal = struct.unpack_from("<3Q", buffer, base + 16)
        counts = struct.unpack_from(f"<{fields['total_unit']}I", buffer, base + 40)
        data = base + 40 + 4 * fields["total_unit"]
        segment = size // len(uids)
        warps = []
        for index, uid in enumerate(uids):
            entries = min(counts[uid] * 4, segment) // 8
            active: dict[int, int] = {}
            events = []
            for k in range(entries):
                word0, word1 = struct.unpack_from("<2I", buffer, data + index * segment + 8 * k)
                scope = (word0 >> 23) & 0xFF
                cycle = ((word0 & 0x7FF) << 32) | word1
                if not word0 >> 31:
                    active.setdefault(scope, cycle)
                elif scope in active:
                    begin = active.pop(scope)
                    if begin <= cycle:
                        events.append((scope, begin, cycle))
            warps.append((uid, events))
        blocks.append({"program": program, "hw": hw, "init": init, "prefinal": prefinal,
                       "postfinal": postfinal, "warps": warps})  # fmt: skip
    return blocks


def _lines(events: list[tuple[int, int, int]]) -> list[int]:
    """``assignLineIds``: each event on the first line where it overlaps nothing."""
    lines: list[list[tuple[int, int]]] = []
    result = [0] * len(events)
    for index in sorted(range(len(events)), key=lambda i: events[i][1]):
        _, begin, end = events[index]
        free = [all(not (begin < e and end > b) for b, e in line) for line in lines]
        number = free.index(True) if True in free else len(lines)
        if number == len(lines):
            lines.append([])
        lines[number].append((begin, end))
        result[index] = number
    return result


def chrome_trace(
    kernels: Sequence[tuple[bytes, str]],
    names: Mapping[int, str] | None = None,
    call_stack: Sequence[str] = (),
) -> str:
    """The ``.chrome_trace`` text ``StreamChromeTraceWriter`` writes for launches of one
    stream (each a host buffer and its kernel name)."""
    names = names or {}
    parsed = [(_parse(buffer), kernel) for buffer, kernel in kernels]
    min_init = min(block["init"] for blocks, _ in parsed for block in blocks)
    events = []
    for blocks, kernel in parsed:
        colors: dict[int, int] = {}
        first = {
            block["program"]: min(
                (b for _, ev in block["warps"] for _, b, _ in ev), default=2**64 - 1
            )
            for block in blocks
        }
        by_proc: dict[int, list[dict]] = {}
        for block in blocks:
            by_proc.setdefault(block["hw"], []).append(block)
        for hw in sorted(by_proc):
            for block in by_proc[hw]:
                adjust = block["init"] - min_init - first[block["program"]]
                for uid, warp_events in block["warps"]:
                    for (scope, begin, end), line in zip(
                        warp_events, _lines(warp_events), strict=True
                    ):
                        colors.setdefault(scope, len(colors) % len(COLORS))
                        events.append({
                            "cname": COLORS[colors[scope]],
                            "name": names.get(scope, f"scope_{scope}"),
                            "cat": kernel,
                            "ph": "X",
                            "pid": f"{kernel} Core{hw} CTA{block['program']}",
                            "tid": f"warp {uid} (line {line})",
                            "ts": (begin + adjust) / 1000.0,
                            "dur": (end - begin) / 1000.0,
                            "args": {
                                "Init Time (ns)": block["init"],
                                "Post Final Time (ns)": block["postfinal"],
                                "Finalization Time (ns)": block["postfinal"] - block["prefinal"],
                                "Frequency (MHz)": 1000.0,
                                "call_stack": list(call_stack),
                            },
                        })  # fmt: skip
    document = {"displayTimeUnit": "ns", "traceEvents": events}
    return json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n"


# --- the benchmark's synthetic buffer ----------------------------------------------------

SYNTHETIC_SMS = 132
SYNTHETIC_WARPS = 4
SYNTHETIC_SEGMENT = 1 << 12
"""Entries per warp segment of the synthetic buffer (32 KiB)."""


def write_synthetic(path: str | Path, records: int) -> int:
    """A host buffer of about ``records`` scope instances (crossing scopes S0 S1 E0 E1 in
    every warp, several CTAs per SM, each SM's counter 1 GHz and consistent with the CTAs'
    init times); return the instances written."""
    per_warp = SYNTHETIC_SEGMENT // 2
    ctas = max(1, -(-records // (per_warp * SYNTHETIC_WARPS)))
    meta = 40 + 4 * SYNTHETIC_WARPS
    data_bytes = SYNTHETIC_SEGMENT * 8 * SYNTHETIC_WARPS
    scratch = -(-(meta + data_bytes) // 128) * 128
    header = struct.pack(
        f"<{10 + SYNTHETIC_WARPS}I", 1, 4, 40 + 4 * SYNTHETIC_WARPS, 40 + 4 * SYNTHETIC_WARPS,
        ctas * scratch, 1, ctas, SYNTHETIC_WARPS, scratch, SYNTHETIC_WARPS,
        *range(SYNTHETIC_WARPS),
    )  # fmt: skip
    blocks = np.zeros((ctas, scratch), np.uint8)
    program = np.arange(ctas)
    hw = program % SYNTHETIC_SMS
    wave = program // SYNTHETIC_SMS
    span = SYNTHETIC_SEGMENT * 20
    init = 10**15 + wave * (span + 1000) + hw * 3
    counter = init - 10**15 + (hw.astype(np.int64) << 33)  # each SM's counter: its own epoch
    head = blocks[:, :meta]
    head[:, :16] = np.stack([np.full(ctas, 0xDEADBEEF), program, hw, np.full(ctas, data_bytes)],
                            axis=1).astype("<u4").view(np.uint8)  # fmt: skip
    head[:, 16:40] = np.stack([init, init + span + 100, init + span + 400], axis=1).astype(
        "<u8").view(np.uint8)  # fmt: skip
    head[:, 40:meta] = np.full((ctas, SYNTHETIC_WARPS), 2 * SYNTHETIC_SEGMENT, "<u4").view(np.uint8)
    k = np.arange(SYNTHETIC_SEGMENT)
    scope = np.where(k % 4 < 2, k % 4, k % 4 - 2)  # S0 S1 E0 E1, again and again
    end = k % 4 >= 2
    warp = np.arange(SYNTHETIC_WARPS)
    cycles = counter[:, None, None] + 10 + warp[None, :, None] + 5 * k[None, None, :]
    word0 = (end.astype(np.uint32) << 31) | (scope.astype(np.uint32) << 23)
    words = np.empty((ctas, SYNTHETIC_WARPS, SYNTHETIC_SEGMENT, 2), "<u4")
    words[..., 0] = word0 | ((cycles >> 32) & 0x7FF).astype(np.uint32)
    words[..., 1] = (cycles & 0xFFFFFFFF).astype(np.uint32)
    blocks[:, meta : meta + data_bytes] = words.reshape(ctas, -1).view(np.uint8)
    with open(path, "wb") as file:
        file.write(header)
        file.write(blocks.tobytes())
    return ctas * SYNTHETIC_WARPS * per_warp


def numpy_decode(path: str | Path) -> dict[str, np.ndarray]:
    """The baseline: every kept entry of every profiled CTA decoded with numpy (frombuffer,
    bit extraction), no wrap order, no pairing, no clocks."""
    raw = np.fromfile(path, np.uint8)
    fields = raw[:40].view("<u4")
    payload_offset, block_num, total_unit, scratch, uid_num = (
        int(fields[i]) for i in (3, 6, 7, 8, 9)
    )
    blocks = raw[payload_offset : payload_offset + block_num * scratch].reshape(block_num, scratch)
    meta = 40 + 4 * total_unit
    size = int(blocks[0, 12:16].view("<u4")[0])
    profiled = blocks[:, :4].copy().view("<u4")[:, 0] == PREAMBLE
    counts = blocks[:, 40:meta].copy().view("<u4")[profiled] // 2
    capacity = size // uid_num // 8
    words = (
        blocks[profiled, meta : meta + size].copy().view("<u4").reshape(-1, uid_num, capacity, 2)
    )
    kept = np.arange(capacity) < np.minimum(counts[:, :uid_num], capacity)[..., None]
    word0, word1 = words[..., 0][kept], words[..., 1][kept]
    return {
        "end": (word0 >> 31).astype(bool),
        "scope": ((word0 >> 23) & 0xFF).astype(np.uint8),
        "cycle": ((word0 & 0x7FF).astype(np.uint64) << 32) | word1,
    }


def write_synthetic_chrome(path: str | Path, records: int) -> int:
    """A ``.chrome_trace`` of about ``records`` scope events as Proton's writer lays them
    out (one kernel; CTAs of 4 warps, two waves on 132 SMs; each CTA's first event at its
    init time less the earliest init), written a CTA at a time; returns the events."""
    per_warp = 256
    ctas = max(1, -(-records // (per_warp * SYNTHETIC_WARPS)))
    k = np.arange(per_warp)
    with open(path, "w") as file:
        file.write('{"displayTimeUnit":"ns","traceEvents":[')
        for cta in range(ctas):
            hw, wave = cta % SYNTHETIC_SMS, cta // SYNTHETIC_SMS
            init = 10**12 + wave * 10**6 + hw * 7
            post, final = init + 10**6 - 100, 50
            lines = []
            for warp in range(SYNTHETIC_WARPS):
                starts = (init - 10**12) + warp + 100 * k
                lines.extend(
                    f'{{"args":{{"Finalization Time (ns)":{final},"Frequency (MHz)":1000.0,'
                    f'"Init Time (ns)":{init},"Post Final Time (ns)":{post},"call_stack":[]}},'
                    f'"cat":"kern","cname":"good","dur":0.05,"name":"scope_{s}","ph":"X",'
                    f'"pid":"kern Core{hw} CTA{cta}","tid":"warp {warp} (line 0)",'
                    f'"ts":{t / 1000.0}}}'
                    for s, t in zip((k % 3).tolist(), starts.tolist(), strict=True)
                )
            file.write(("," if cta else "") + ",".join(lines))
        file.write("]}\n")
    return ctas * SYNTHETIC_WARPS * per_warp
