"""Files written aside and renamed into place (``export.files``): what each pass of a writer
leaves in the hidden file, plain or gzipped, and its pages written out to disk behind the
writer."""

from __future__ import annotations

import ctypes
import errno
import gzip
import os
import sys
import time
from pathlib import Path

import pytest

from multicore_profiler.errors import ExportError
from multicore_profiler.export import files as files_module
from multicore_profiler.export.files import aside_sink, written_aside


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_second_pass_replaces_all_the_first_one_wrote(tmp_path: Path, gz: bool) -> None:
    """A writer whose first pass found sub-tracks writes the file again from its start (see
    ``chrome_trace._write``): nothing of the longer first pass may remain after it."""
    path = tmp_path / ("trace.json.gz" if gz else "trace.json")
    path.write_bytes(b"an older trace")
    with written_aside(path, ExportError, "the trace") as aside:
        assert aside.read_bytes() == b""
        with aside_sink(aside, gz) as sink:
            sink.write(b'{"traceEvents": [1, 2, 3, 4, 5, 6]}')
        with aside_sink(aside, gz) as sink:
            sink.write(b'{"traceEvents": []}')
        assert path.read_bytes() == b"an older trace"
    written = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
    assert written == b'{"traceEvents": []}'
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


_CACHESTAT = 451
"""``cachestat``'s system call number (Linux 6.5 on; the same on x86-64 and arm64)."""


def unwritten_pages(path: Path) -> int:
    """The pages of ``path`` in the page cache not yet on disk (dirty or being written
    back), as the kernel's ``cachestat`` counts them; the test skips where there is none."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the write-out behind a writer is Linux's sync_file_range")
    libc = ctypes.CDLL(None, use_errno=True)
    span = (ctypes.c_uint64 * 2)(0, 0)  # from the start to the end of the file
    counts = (ctypes.c_uint64 * 5)()  # cache, dirty, writeback, evicted, recently evicted
    fd = os.open(path, os.O_RDONLY)
    try:
        failed = libc.syscall(_CACHESTAT, fd, span, counts, 0)
    finally:
        os.close(fd)
    if failed:
        code = ctypes.get_errno()
        if code == errno.ENOSYS:
            pytest.skip("this kernel has no cachestat (Linux 6.5 on) to count dirty pages")
        raise OSError(code, os.strerror(code))
    return counts[1] + counts[2]


def test_a_file_written_aside_is_written_out_to_disk_while_the_writer_works(
    tmp_path: Path,
) -> None:
    """Renaming a file over an existing one makes ext4 write the new one out first, and the
    rename waits for it: so the pages a writer wrote are started out to disk behind it,
    and none is left for the rename to wait for a little after the writing stops. Without
    that the kernel would keep them dirty for its expiry time (30 s by default)."""
    path = tmp_path / "trace.json"
    path.write_bytes(b"an older trace")
    data = os.urandom(1 << 20) * 16
    with (
        written_aside(path, ExportError, "the trace") as aside,
        aside_sink(aside, gz=False) as sink,
    ):
        sink.write(data)
        sink.flush()
        assert os.stat(aside).st_size == len(data)
        deadline = time.monotonic() + 5
        while unwritten_pages(aside) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert unwritten_pages(aside) == 0
    assert path.read_bytes() == data


def test_a_directory_that_cannot_be_listed_is_still_written_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory its user may write but not list (mode -wx): no hidden file left by a
    killed writer can be found there, and the trace is written all the same."""

    def unlisted(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(files_module.os, "scandir", unlisted)
    path = tmp_path / "trace.json"
    with written_aside(path, ExportError, "the trace") as aside:
        aside.write_bytes(b"{}")
    monkeypatch.undo()
    assert path.read_bytes() == b"{}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
