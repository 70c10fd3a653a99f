"""The SHA-256 of a file's bytes, read a block at a time: memory does not grow with the
file. Here, below every room that digests a file (a trace's source id, a kept table's
manifest)."""

from __future__ import annotations

import hashlib
from pathlib import Path

_BLOCK_BYTES = 1 << 18
"""What Python 3.11's ``hashlib.file_digest`` reads at a time: on a cached file of 184 MiB,
0.156 s as it takes, against 0.170 s reading 4 MiB blocks."""


def file_sha256(path: Path) -> tuple[int, str]:
    """The size of ``path``'s bytes as stored (compressed, for a ``.gz``) and their SHA-256."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as source:
        while block := source.read(_BLOCK_BYTES):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()
