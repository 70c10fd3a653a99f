"""A file read through a read-only memory map whose pages are handed back after each
chunk, so that an importer's resident memory follows the chunk it decodes, not the file.

The kernel keeps the pages in its cache (a second pass reads them again at no disk cost);
they only stop counting in this process's memory until they are touched again.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np


class MappedFile:
    """A whole (non-empty) file as a read-only map: ``array`` views it, ``release`` hands
    back the pages read so far."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as file:
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)

    def array(self, dtype: np.dtype | str, offset: int = 0, count: int = -1) -> np.ndarray:
        """``count`` values of ``dtype`` from byte ``offset`` (all the rest: -1), a view."""
        return np.frombuffer(self._map, dtype, count, offset)

    def release(self) -> None:
        """Drop the mapped pages from this process (where the platform allows it)."""
        dont_need = getattr(mmap, "MADV_DONTNEED", None)
        if dont_need is not None:
            self._map.madvise(dont_need)
