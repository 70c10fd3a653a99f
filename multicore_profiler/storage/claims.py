"""Invocation ids that writers of one (run, rank) cannot share, without a lock server.

Before it writes a step, a writer *claims* the ids its invocations take with a small
object beside the run's invocations files,
``invocations/run_id=<run>/_claim-<rank>-<first>-<last>-<token>.json`` (the range is in
the name, so a listing is all a writer reads; a leading ``_`` hides it from Spark and
Hive, and no view reads anything but ``*.parquet``). It then lists the claims of (run,
rank) and the ids committed there. If another claim or a committed id overlaps its
range, it withdraws its claim (deletes it) and tries again after a random backoff; else
the ids are its own until it deletes the claim, after the commit.

Two overlapping claims cannot both survive on a filesystem whose listings show every
write that completed before them (a local directory; S3, GCS): of two writers, the one
that lists later sees the other's claim, and the claims are listed before the committed
ids, so a claim deleted after its commit still shows as those ids. Both may withdraw;
the random backoff makes them come back at different times. A writer takes the lowest
free ids, so the ranges of writers that withdrew are taken again: without deaths, a
run's ids stay 0, 1, 2, ... whatever the races.

A claim older than ``ORPHAN_AGE`` belongs to a writer that died: it holds no id, and the
vacuum deletes it; ``gc`` removes a run's claims with its invocations. Claims live in the
run's invocations directory rather than a directory of their own so that an object store
keeps no empty "directory" marker where a deleted claim was.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np

from multicore_profiler.errors import ArgumentError, StoreError
from multicore_profiler.limits import INT64_MAX, INVOCATION_ID, RANK
from multicore_profiler.storage.location import StoreLocation, store_write
from multicore_profiler.storage.partitions import check_run_id, past_orphan_age, utc
from multicore_profiler.storage.schema import INVOCATIONS

if TYPE_CHECKING:
    from multicore_profiler.storage.handle import StoreHandle

ATTEMPTS = 40
"""Claims a writer makes before it gives up (each after a random backoff)."""
BACKOFF_S = 0.005
"""The first backoff's mean; each next one doubles, up to ``MAX_BACKOFF_S``."""
MAX_BACKOFF_S = 0.5
CLAIM_NAME = re.compile(
    r"_claim-(?P<rank>\d{1,10})-(?P<first>\d{1,19})-(?P<last>\d{1,19})-(?P<token>[0-9a-f]{32})\.json"
)
"""A claim's file name."""


@dataclass(frozen=True)
class Claim:
    """A claim of the ids ``first`` .. ``last`` (inclusive) of one (run, rank)."""

    first: int
    last: int
    path: str
    """The claim object's path, as the store's filesystem names it."""
    mtime: datetime | None

    def overlaps(self, first: int, last: int) -> bool:
        """Whether the claim holds any id of ``first`` .. ``last``."""
        return self.first <= last and first <= self.last

    def __str__(self) -> str:
        return f"{self.first}..{self.last}"


def claims_dir(run_id: str) -> str:
    """Where a run's claims lie, relative to the store: its invocations directory."""
    return f"{INVOCATIONS.name}/run_id={check_run_id(run_id)}"


def list_claims(location: StoreLocation, run_id: str, rank: int | None = None) -> list[Claim]:
    """The claims of a run (of one rank), live or not."""
    found = []
    for info in location.files(claims_dir(run_id)):
        matched = CLAIM_NAME.fullmatch(info.base_name)
        if not matched or (rank is not None and int(matched["rank"]) != rank):
            continue
        first, last = int(matched["first"]), int(matched["last"])
        if first <= last <= INT64_MAX:  # else no writer's claim ('mcprof check' says so)
            mtime = None if info.mtime is None else utc(info.mtime)
            found.append(Claim(first, last, info.path, mtime))
    return found


@contextmanager
def claimed_ids(
    store: StoreHandle, run_id: str, rank: int, count: int, first: int | None = None
) -> Iterator[int]:
    """Hold ``count`` invocation ids of (run, rank) for one write; yield the first.

    ``hold_ids`` for the block: the claim is deleted when it ends, after the commit.
    """
    claim = hold_ids(store, run_id, rank, count, first)
    try:
        yield claim.first
    finally:
        release_claim(store.location, claim)


def hold_ids(
    store: StoreHandle, run_id: str, rank: int, count: int, first: int | None = None
) -> Claim:
    """Claim ``count`` invocation ids of (run, rank) until ``release_claim``, which its
    holder calls after the writes that take them are committed (a capture session holds
    blocks of ids for its whole life).

    With ``first`` None they are the lowest ids free of committed and claimed ones (after
    the highest, unless a range left by a withdrawn or dead writer's claim fits); else
    exactly ``first`` .. ``first + count - 1``, refused with a ``StoreError`` naming the
    ids if any is committed or stays claimed by another writer. ``ArgumentError`` where
    the ids would pass 2^63-1.
    """
    RANK.check(rank, "rank")
    if first is not None:
        INVOCATION_ID.check(first, "the first invocation id")
    if count < 1:
        raise StoreError(f"a write takes at least one invocation id, not {count}")
    location = store.location
    delay = BACKOFF_S
    clashes: list[Claim] = []
    for _attempt in range(ATTEMPTS):
        live = _live(location, run_id, rank)  # claims first, then the committed ids
        start = _lowest_free(store, run_id, rank, count, live) if first is None else first
        last = start + count - 1
        if last > INT64_MAX:
            raise ArgumentError(
                f"run {run_id} rank {rank}: {count} invocation(s) from id {start} would pass "
                f"the largest invocation id, {INT64_MAX}"
            )
        if first is not None:
            _refuse_committed(store, run_id, rank, start, last)
        own = _write_claim(location, run_id, rank, start, last)
        try:
            clashes = [
                c
                for c in _live(location, run_id, rank)
                if c.path != own and c.overlaps(start, last)
            ]
            if not clashes and not _committed(store, run_id, rank, start, last):
                return Claim(start, last, own, None)
        except BaseException:
            release_claim(location, Claim(start, last, own, None))
            raise
        release_claim(location, Claim(start, last, own, None))  # withdrawn on a clash
        if first is not None:
            _refuse_committed(store, run_id, rank, start, last)
        time.sleep(random.uniform(0, 2 * delay))
        delay = min(2 * delay, MAX_BACKOFF_S)
    held = ", ".join(sorted({str(c) for c in clashes}))
    raise StoreError(
        f"run {run_id} rank {rank}: could not claim invocation ids after {ATTEMPTS} attempts: "
        f"other writers claim {held} (a dead writer's claim, {claims_dir(run_id)}/_claim-{rank}-*, "
        "is ignored once a day old, and 'mcprof compact' deletes it)"
    )


def release_claim(location: StoreLocation, claim: Claim) -> None:
    """Delete a claim: its ids that are not committed are free again."""
    with store_write(f"withdraw the claim {claim.path}"):
        location.delete_file(claim.path)


def _live(location: StoreLocation, run_id: str, rank: int) -> list[Claim]:
    now = datetime.now(timezone.utc)
    return [c for c in list_claims(location, run_id, rank) if not past_orphan_age(c.mtime, now)]


def _lowest_free(
    store: StoreHandle, run_id: str, rank: int, count: int, claims: list[Claim]
) -> int:
    """The lowest first id of ``count`` ids free of committed ids and of ``claims``: the
    first gap wide enough between taken ranges, else past them all."""
    ids = store.invocation_ids(run_id, rank)
    firsts = np.concatenate([ids, np.array([c.first for c in claims], np.int64)])
    lasts = np.concatenate([ids, np.array([c.last for c in claims], np.int64)])
    if len(firsts) == 0:
        return 0
    order = np.lexsort((lasts, firsts))
    firsts, lasts = firsts[order], lasts[order]
    # The highest id taken before each range (-1 before the first).
    before = np.concatenate([[-1], np.maximum.accumulate(lasts)[:-1]])
    wide = np.flatnonzero(firsts - before - 1 >= count)
    return int(before[wide[0]]) + 1 if len(wide) else int(lasts.max()) + 1


def _committed(store: StoreHandle, run_id: str, rank: int, first: int, last: int) -> list[int]:
    """The committed ids of (run, rank) in ``first`` .. ``last``."""
    ids = store.invocation_ids(run_id, rank)
    return ids[(ids >= first) & (ids <= last)].tolist()


def _refuse_committed(store: StoreHandle, run_id: str, rank: int, first: int, last: int) -> None:
    """``StoreError`` naming the ids of ``first`` .. ``last`` that are committed, if any."""
    taken = _committed(store, run_id, rank, first, last)
    if taken:
        shown = str(taken) if len(taken) <= 10 else f"[{', '.join(map(str, taken[:10]))}, ...]"
        raise StoreError(
            f"run {run_id} already holds invocation(s) {shown} of rank {rank}; "
            "leave out --invocation to append after them"
        )


def _write_claim(location: StoreLocation, run_id: str, rank: int, first: int, last: int) -> str:
    """Write a claim object; return its path."""
    relative = f"{claims_dir(run_id)}/_claim-{rank}-{first}-{last}-{secrets.token_hex(16)}.json"
    body = {
        "run_id": run_id,
        "rank": rank,
        "first": first,
        "last": last,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "claimed_at": datetime.now(timezone.utc).isoformat(),
    }
    with store_write(f"claim invocation ids {first}..{last} of run {run_id} rank {rank}"):
        return location.put(relative, json.dumps(body).encode())
