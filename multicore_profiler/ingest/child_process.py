"""Fresh interpreters that serve the process that started them over a socket pair: the
capture session's writer process and the trace reader's workers.

A child runs the package without its ``__init__`` and imports only the module it serves
from, so it starts light (no DuckDB, no torch) and copies nothing of its parent: not its
state, as a fork would, nor its main module, which ``multiprocessing``'s spawn and
forkserver import again (running a script with no ``if __name__ == "__main__"`` guard a
second time).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

_PACKAGE = Path(__file__).resolve().parents[1]

_BOOTSTRAP = """\
import importlib, importlib.util, sys
spec = importlib.util.spec_from_file_location(
    "multicore_profiler", sys.argv[1] + "/__init__.py", submodule_search_locations=[sys.argv[1]]
)
sys.modules["multicore_profiler"] = importlib.util.module_from_spec(spec)
importlib.import_module("multicore_profiler.no_pandas").keep_pandas_out()
module, function = sys.argv[3].split(":")
getattr(importlib.import_module(module), function)(int(sys.argv[2]))
"""
"""A child's program: the package without its ``__init__`` and without pandas (see
``no_pandas``), then ``entry`` called with the descriptor of the child's end of the socket
pair."""


def start_child(
    entry: str, *, stdout: int | IO[bytes] | None = None, stderr: int | IO[bytes] | None = None
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """A fresh interpreter calling ``entry`` (``module:function`` of the package) with its
    end of a socket pair, and this process's end. ``stdout`` and ``stderr`` as
    ``subprocess.Popen`` takes them (default: this process's)."""
    ours, theirs = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP, str(_PACKAGE), str(theirs.fileno()), entry],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours
