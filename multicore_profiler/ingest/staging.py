"""Host memory shared with the writer: the segments a session copies step buffers into.

A segment is an anonymous memory file (``memfd``, or an unlinked temporary file where
the system has none). It has no name that a killed process could leave behind: the
memory is freed once the session and the writer have both closed it. The session maps
each segment once and hands its descriptor to the writer, which maps it too and reads
the buffers in place, so a step's bytes are copied once, from the device.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from dataclasses import dataclass

import numpy as np

MIN_SEGMENT_BYTES = 64 << 10
"""The smallest segment made: small steps of different sizes share one."""


@dataclass
class Segment:
    """One shared segment: its id, size, descriptor and the mapping's bytes."""

    id: int
    size: int
    fd: int
    memory: mmap.mmap

    @property
    def view(self) -> np.ndarray:
        """The segment's bytes as a ``uint8`` array (no copy)."""
        return np.frombuffer(self.memory, dtype=np.uint8)

    def close(self) -> None:
        """Close this side's descriptor; the mapping goes with the last view of it (an
        array still referenced, by a traceback for one, keeps it valid until then)."""
        os.close(self.fd)


def new_memory_file(size: int) -> int:
    """A descriptor of ``size`` zeroed bytes of anonymous memory."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("mcprof-step", os.MFD_CLOEXEC)
    else:  # systems without memfd (macOS)
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_segment(segment_id: int, fd: int, size: int) -> Segment:
    """The segment behind a descriptor (the writer's side; it owns ``fd`` from now on)."""
    return Segment(segment_id, size, fd, mmap.mmap(fd, size))


class Segments:
    """The session's segments: at most ``limit``, reused for steps that fit them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free: list[Segment] = []
        self._taken: dict[int, Segment] = {}
        self._next_id = 0

    def take(self, nbytes: int) -> tuple[Segment, bool, int | None]:
        """A segment of at least ``nbytes``, whether it is new (the writer has not mapped
        it yet), and the id of a free segment closed to make room for it (the writer
        unmaps it too). The caller takes at most ``limit`` at once."""
        fitting = [s for s in self._free if s.size >= nbytes]
        if fitting:
            segment = min(fitting, key=lambda s: s.size)
            self._free.remove(segment)
            self._taken[segment.id] = segment
            return segment, False, None
        dropped = None
        if len(self._free) + len(self._taken) >= self.limit:
            smallest = min(self._free, key=lambda s: s.size)  # too small for this step
            self._free.remove(smallest)
            smallest.close()
            dropped = smallest.id
        size = max(MIN_SEGMENT_BYTES, 1 << (nbytes - 1).bit_length())
        fd = new_memory_file(size)
        segment = map_segment(self._next_id, fd, size)
        self._next_id += 1
        self._taken[segment.id] = segment
        return segment, True, dropped

    def give_back(self, segment_id: int) -> None:
        """The writer is done with a segment: it can take the next step."""
        self._free.append(self._taken.pop(segment_id))

    @property
    def taken(self) -> int:
        """Segments handed to the writer and not given back yet."""
        return len(self._taken)

    def close(self) -> None:
        """Close every segment (the writer keeps its own mappings while it needs them)."""
        for segment in [*self._free, *self._taken.values()]:
            segment.close()
        self._free.clear()
        self._taken.clear()
