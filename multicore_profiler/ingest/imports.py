"""``import_profile``: other MegaKernel profilers' files into the store, by format name.

Each format is one module ``ingest/import_<name>.py`` with a ``read(path, options)`` that
yields ``ImportedInvocation`` values (see ``ingest/imported.py``); it is imported only
when its format is asked for. All files of one call become one run.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

from multicore_profiler.errors import ArgumentError, ImportFormatError
from multicore_profiler.ingest.imported import ImportedInvocation, ImportedRun, write_imported
from multicore_profiler.storage.store import Store

FORMATS = {
    "proton": "import_proton",
    "flashinfer": "import_tagged",
    "mpk": "import_tagged",
    "triton-distributed": "import_tagged",
    "hazy": "import_hazy",
    "simpler": "import_simpler",
}
"""Format name -> its reader module under ``ingest/``."""


@dataclass(frozen=True)
class ImportOptions:
    """What a file does not say and its user may: each reader reads the ones its format
    needs and ignores the rest."""

    format: str
    kernel_name: str | None = None
    """The kernel's name, where the file names none (or to override it)."""
    frequency_hz: float | None = None
    """The cycle counter's frequency, for producers that count cycles (Proton, HazyResearch);
    each reader documents its default."""
    names: Mapping[int, str] = field(default_factory=dict)
    """Stage names by the producer's own id: Proton scope ids, FlashInfer event indices,
    Triton-distributed task types, HazyResearch opcodes, simpler func ids."""
    rank: int | None = None
    """The rank the launches ran on, where the file does not say."""
    dependencies: Path | None = None
    """simpler: the ``deps.json`` of the run (its task graph)."""


def import_profile(
    store: Store,
    paths: Sequence[str | PathLike[str]],
    *,
    format: str,
    run_id: str | None = None,
    label: str | None = None,
    tags: Mapping[str, str] | None = None,
    kernel_name: str | None = None,
    frequency_hz: float | None = None,
    names: Mapping[int, str] | None = None,
    rank: int | None = None,
    dependencies: str | PathLike[str] | None = None,
) -> ImportedRun:
    """Import other profilers' files of ``format`` (see ``FORMATS``) as one run of the
    store; return the run, its write and invocation ids. Nothing is visible unless every
    file imports."""
    options = ImportOptions(
        format=format,
        kernel_name=kernel_name,
        frequency_hz=frequency_hz,
        names=dict(names or {}),
        rank=rank,
        dependencies=None if dependencies is None else Path(dependencies),
    )
    if not paths:
        raise ArgumentError("import needs at least one file")
    return write_imported(
        store, read_profiles(paths, options), run_id=run_id, label=label, tags=tags
    )


def read_profiles(
    paths: Sequence[str | PathLike[str]], options: ImportOptions
) -> Iterator[ImportedInvocation]:
    """The launches of each file, in order, read by the reader of ``options.format``."""
    if options.format not in FORMATS:
        raise ArgumentError(
            f"unknown import format {options.format!r}; known: {', '.join(FORMATS)}"
        )
    files = [Path(path) for path in paths]
    for path in files:
        if not path.is_file():
            raise ImportFormatError(f"{path}: no such file")
    reader = importlib.import_module(f"{__package__}.{FORMATS[options.format]}")
    for path in files:
        yield from reader.read(path, options)
