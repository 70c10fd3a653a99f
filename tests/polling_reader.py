"""A process that queries a store in a loop while a test changes it under its feet.

``python polling_reader.py STORE DONE`` counts the records of STORE (rows, the sum of
their start cycles, distinct record keys) in a loop until the file DONE exists, then
prints a line per query: its start and end time and the three numbers. The file
``DONE.ready`` appears once the first query has run. ``poll_during`` runs it around an
action of the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
QUERY = """SELECT count(*) AS n, sum(start_cycle)::VARCHAR AS s,
    count(DISTINCT (run_id, rank, invocation_id, core_type, block_id, record_index)) AS u
FROM records"""


def poll_during(where: str, scratch: Path, action: Callable[[], T]) -> tuple[T, set[str], int]:
    """Run ``action`` while the reader queries the store at ``where``: its result, the
    distinct answers the reader saw ("rows sum distinct"), and how many of its queries
    overlapped the action."""
    done = scratch / "done"
    reader = subprocess.Popen(
        [sys.executable, __file__, where, str(done)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    ready = Path(f"{done}.ready")
    deadline = time.monotonic() + 120
    while not ready.exists():  # the reader is in its query loop
        assert reader.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.02)
    began = time.time()
    result = action()
    ended = time.time()
    done.touch()
    out, _ = reader.communicate(timeout=120)
    assert reader.returncode == 0
    queries = [line.split(" ", 2) for line in out.strip().split("\n")]
    during = sum(1 for q in queries if float(q[1]) > began and float(q[0]) < ended)
    return result, {q[2] for q in queries}, during


def main() -> None:
    from multicore_profiler.storage.store import open_store

    store = open_store(sys.argv[1], create=False)
    done = Path(sys.argv[2])
    seen: list[str] = []
    while not done.exists() or not seen:
        began = time.time()
        row = store.sql(QUERY).to_pylist()[0]
        seen.append(f"{began} {time.time()} {row['n']} {row['s']} {row['u']}")
        Path(f"{done}.ready").touch()
    print("\n".join(seen))


if __name__ == "__main__":
    main()
