"""The ranks of one job into the store: traces and profiler output folders.

``ingest_job`` takes what a user names a job's ranks by: trace files, torch_npu output
folders (a ``*_ascend_pt`` folder, or a folder holding one per rank) or both, and loads
each as a rank of one job: the job named, else one named by the SHA-256 of the ranks'
sources (the same files make the same job). Two sources may not claim one rank.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from multicore_profiler.errors import ArgumentError
from multicore_profiler.ingest.ascend_output import RankFolder, rank_folders, read_rank_folder
from multicore_profiler.ingest.outer_trace import (
    TraceSource,
    ingest_outputs,
    ingest_trace,
    trace_digest,
)
from multicore_profiler.storage.store import Store


def _ranks(items: Sequence[str | os.PathLike[str]]) -> list[Path | RankFolder]:
    """Each item as a trace file or the rank folders it names, in order."""
    ranks: list[Path | RankFolder] = []
    for item in map(Path, items):
        if item.is_dir():
            ranks.extend(read_rank_folder(folder) for folder in rank_folders(item))
        else:
            ranks.append(item)
    return ranks


def _digests(ranks: Sequence[Path | RankFolder]) -> list[tuple[Path, str]]:
    """Each trace file, and every file of each rank folder without a trace, with its
    SHA-256, in order."""
    files: list[Path] = []
    for rank in ranks:
        if isinstance(rank, Path):
            files.append(rank)
        elif rank.trace is not None:
            files.append(rank.trace)
        else:
            files.extend(f for f in sorted(rank.path.rglob("*")) if f.is_file())
    return [(f, trace_digest(f)) for f in files]


def _job_name(digests: Sequence[tuple[Path, str]]) -> str:
    """A job named by its ranks' contents: ``job-`` and 16 hex digits of the SHA-256 of
    their files' digests, in order of the digests."""
    text = "\n".join(sorted(digest for _, digest in digests))
    return "job-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def ingest_job(
    store: Store,
    items: Sequence[str | os.PathLike[str]],
    *,
    job: str | None = None,
    rank: int | None = None,
    label: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> list[TraceSource]:
    """Load every trace and output folder of ``items`` as the ranks of one job (``job``,
    else one named by their contents; a single trace file is a job of its own, named by
    its source id); return their sources in order. ``rank`` is for a single trace whose
    rank the file does not say. Raises what ``ingest_trace`` raises, and
    ``TraceFormatError`` for a folder that is no profiler output; the ranks loaded before
    a refusal stay in the store. The ranks without a trace are checked and loaded first, in
    one pass."""
    ranks = _ranks(items)
    if rank is not None and len(ranks) > 1:
        raise ArgumentError(f"rank {rank} was given for {len(ranks)} traces: give it for one")
    digests: dict[Path, str] = {}  # the traces' digests, computed once for the job's name
    if job is None and (len(ranks) > 1 or isinstance(ranks[0], RankFolder)):
        named = _digests(ranks)
        job = _job_name(named)
        digests = dict(named)
    loaded: dict[int, TraceSource] = {}
    outputs = [
        (i, one) for i, one in enumerate(ranks) if isinstance(one, RankFolder) and not one.trace
    ]
    batch = [(one.path, one.rank, one.context) for _, one in outputs]
    for (index, _), source in zip(
        outputs, ingest_outputs(store, batch, label=label, tags=tags, job=job), strict=True
    ):
        loaded[index] = source
    for index, one in enumerate(ranks):
        if isinstance(one, Path):
            loaded[index] = ingest_trace(
                store, one, rank=rank, label=label, tags=tags, job=job, sha256=digests.get(one)
            )
        elif one.trace is not None:
            loaded[index] = ingest_trace(
                store, one.trace, rank=one.rank, label=label, tags=tags, job=job,
                context=one.context, sha256=digests.get(one.trace),
            )  # fmt: skip
    return [loaded[index] for index in range(len(ranks))]
