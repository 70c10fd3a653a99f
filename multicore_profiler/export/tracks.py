"""Tracks without partial overlaps: what Perfetto needs of the slices of one thread.

A core's records follow one another, but where the clock is coarser than a record,
a record can start before the previous one ends. Perfetto keeps one stack of slices
per track and drops (or spills) a slice that ends after the slice it started in;
such a record goes to a sub-track (a lane) of its core instead.
"""

from __future__ import annotations

import numpy as np


def assign_lanes(track: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The lane of each slice: 0 for its track, 1, 2... for sub-tracks, so that on every
    lane two slices either nest or do not overlap.

    Slices come sorted by track, then start, longest first. A track whose slices of
    positive length follow one another (the usual case) keeps every slice: a slice of
    zero length cannot overlap partially. Only the other tracks are looked at one slice
    at a time.
    """
    lane = np.zeros(len(track), dtype=np.int64)
    edges = np.concatenate([[0], np.flatnonzero(track[1:] != track[:-1]) + 1, [len(track)]])
    for first, last in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        starts, ends = start[first:last], end[first:last]
        timed = ends > starts
        later, reach = starts[timed][1:], np.maximum.accumulate(ends[timed])[:-1]
        if (later < reach).any():
            lane[first:last] = _lanes(starts.tolist(), ends.tolist())
    return lane


def _lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Greedy: each slice goes to the first lane where it nests in the open slice or where
    every open slice has ended."""
    stacks: list[list[int]] = []
    lanes = []
    for start, end in zip(starts, ends, strict=True):
        for number, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                lanes.append(number)
                break
        else:
            stacks.append([end])
            lanes.append(len(stacks) - 1)
    return lanes
