"""Trace files written aside and renamed into place: no reader sees half a trace, and a
failure leaves no file behind and an older one at the path as it was."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from multicore_profiler.errors import ProfileError


@contextmanager
def written_aside(path: Path, error: type[ProfileError], what: str) -> Iterator[Path]:
    """The hidden path beside ``path`` to write; renamed to ``path`` when the block ends.
    An ``OSError`` becomes ``error`` ("cannot write <what> to <path>: ...")."""
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield aside
        os.replace(aside, path)
    except OSError as exc:
        aside.unlink(missing_ok=True)
        raise error(f"cannot write {what} to {path}: {exc.strerror or exc}") from exc
    except BaseException:
        aside.unlink(missing_ok=True)
        raise
