"""Protobuf encoding benchmark: ``proto_rows.Messages`` against the official runtime.

Encodes 1,000,000 TracePacket-shaped messages framed as ``Trace.packet`` (field 1): a
timestamp, the trusted sequence id and a nested TrackEvent (type, track_uuid, name_iid, a
category iid, 7 DebugAnnotations {name_iid, uint_value} with cycles about 2**33 and ids below
2**16, 0-2 flow ids). The baseline builds the same messages as ``perfetto_trace_pb2`` objects
and serializes them with ``SerializeToString``, timed on a sample and scaled. Both byte strings
must be identical. Goal: >= 3 M messages/s for ``Messages``.

    .venv/bin/python bench/proto_rows.py [--messages 1000000] [--sample 50000] [--repeat 5]
        [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from multicore_profiler.export.proto_rows import Messages

ANNOTATIONS = 7
T = TypeVar("T")


@dataclass(frozen=True)
class Columns:
    """The values of the benchmark's messages, one array per field."""

    timestamp: np.ndarray
    kind: np.ndarray
    track_uuid: np.ndarray
    name_iid: np.ndarray
    annotations: np.ndarray
    flow_ids: np.ndarray
    flow_offsets: np.ndarray

    def head(self, rows: int) -> Columns:
        """The first ``rows`` messages."""
        end = int(self.flow_offsets[rows])
        return Columns(
            self.timestamp[:rows],
            self.kind[:rows],
            self.track_uuid[:rows],
            self.name_iid[:rows],
            self.annotations[:rows],
            self.flow_ids[:end],
            self.flow_offsets[: rows + 1],
        )


def columns(rows: int, seed: int = 22) -> Columns:
    """Realistic values: ns timestamps of a run, 72 core tracks, cycles, ids, flows."""
    rng = np.random.default_rng(seed)
    start = rng.integers(2**33, 2**34, rows, dtype=np.uint64)
    end = start + rng.integers(0, 5000, rows, dtype=np.uint64)
    annotations = np.stack(
        [
            rng.integers(0, 2**16, rows, dtype=np.uint64),
            np.full(rows, 0x10000, np.uint64) + rng.integers(0, 8, rows, dtype=np.uint64),
            rng.integers(0, 2**10, rows, dtype=np.uint64),
            np.where(rng.random(rows) < 0.1, 0xFFFFFFFF, rng.integers(0, 64, rows)).astype(
                np.uint64
            ),
            start,
            end,
            rng.integers(0, 2**12, rows, dtype=np.uint64),
        ],
        axis=1,
    )
    counts = rng.integers(0, 3, rows)
    return Columns(
        timestamp=10**12 + np.cumsum(rng.integers(0, 2000, rows, dtype=np.uint64)),
        kind=rng.integers(1, 3, rows, dtype=np.int32),
        track_uuid=1000 + rng.integers(0, 72, rows, dtype=np.uint64),
        name_iid=rng.integers(1, 2**16, rows, dtype=np.uint64),
        annotations=annotations,
        flow_ids=rng.integers(0, 2**63, int(counts.sum()), dtype=np.uint64),
        flow_offsets=np.concatenate([[0], np.cumsum(counts)]),
    )


def built(data: Columns) -> Messages:
    """The trace as ``Messages``, fields in field-number order."""
    rows = len(data.timestamp)
    event = Messages(rows).varint(3, 1)
    for index in range(ANNOTATIONS):
        annotation = Messages(rows).varint(1, index + 1).varint(3, data.annotations[:, index])
        event.message(4, annotation)
    event.varint(9, data.kind).varint(10, data.name_iid).varint(11, data.track_uuid)
    event.repeated_fixed64(47, data.flow_ids, data.flow_offsets)
    packet = Messages(rows).varint(8, data.timestamp).varint(10, 1).message(11, event)
    return Messages(rows).message(1, packet)


def ours(data: Columns, threads: int | None = None) -> np.ndarray:
    """The trace's bytes the way the writer makes them: sizes, then rows written into one
    buffer (back to back here)."""
    trace = built(data)
    sizes = trace.sizes()
    out = np.empty(int(sizes.sum()), np.uint8)
    trace.write_into(out, np.cumsum(sizes) - sizes, threads)
    return out


def official(data: Columns) -> bytes:
    """The same trace as ``perfetto_trace_pb2`` objects, serialized by the protobuf runtime."""
    trace = pb.Trace()
    annotations = data.annotations.tolist()
    offsets = data.flow_offsets.tolist()
    flows = data.flow_ids.tolist()
    for row, (ts, kind, uuid, name) in enumerate(
        zip(
            data.timestamp.tolist(),
            data.kind.tolist(),
            data.track_uuid.tolist(),
            data.name_iid.tolist(),
            strict=True,
        )
    ):
        packet = trace.packet.add(timestamp=ts, trusted_packet_sequence_id=1)
        event = packet.track_event
        event.category_iids.append(1)
        for index, value in enumerate(annotations[row]):
            event.debug_annotations.add(name_iid=index + 1, uint_value=value)
        event.type = kind
        event.name_iid = name
        event.track_uuid = uuid
        event.flow_ids.extend(flows[offsets[row] : offsets[row + 1]])
    return trace.SerializeToString()


def timed(task: Callable[[], T], repeat: int) -> tuple[list[float], T]:
    """Seconds of each of ``repeat`` runs of ``task`` and its last result."""
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        result = task()
        seconds.append(time.perf_counter() - began)
    return seconds, result


def report(name: str, seconds: list[float], messages: int, scale: float = 1.0) -> float:
    """Print median and spread of ``seconds`` for ``messages`` (times ``scale``); messages/s."""
    median = statistics.median(seconds) * scale
    rate = messages / median
    print(
        f"{name:>10}: median {median:.3f} s (spread {min(seconds) * scale:.3f}-"
        f"{max(seconds) * scale:.3f} s over {len(seconds)}), {rate / 1e6:.2f} M messages/s"
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--sample", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="default: one per CPU")
    args = parser.parse_args()
    data = columns(args.messages)
    sample = data.head(args.sample)
    ours_s, encoded = timed(lambda: ours(data, args.threads), args.repeat)
    base_s, reference = timed(lambda: official(sample), args.repeat)
    per_message = len(encoded) / args.messages
    print(f"{args.messages} messages, {len(encoded)} bytes ({per_message:.1f} a message)")
    rate = report("Messages", ours_s, args.messages)
    base = report("official", base_s, args.messages, args.messages / args.sample)
    print(f"ratio: {rate / base:.1f}x")
    identical = (
        encoded[: len(reference)].tobytes() == reference and built(sample).encode() == reference
    )
    print(f"bytes identical to the official runtime's on the {args.sample} sample: {identical}")
    if not identical:
        raise SystemExit("encodings differ")


if __name__ == "__main__":
    main()
