"""Shared checks of the hostile-input corpus (``tests/test_hostile_*.py``): a bad input
ends in exactly one ``mcprof: error: ...`` line, the exit status, and a store whose
files and bytes are what they were."""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from multicore_profiler.cli import main
from multicore_profiler.storage.verified import RECORD_FILES


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (the store), relative path -> SHA-256 of its bytes; but
    the store's record of verified files, which any command that reads files may add to
    (``storage.verified``: a cache of checks, no data)."""
    if not root.exists():
        return {}
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and str(path.relative_to(root)) not in RECORD_FILES
    }


def refused(
    capsys: pytest.CaptureFixture[str], *argv: str, status: int = 1, store: Path | None = None
) -> str:
    """Run ``mcprof argv``; assert it exits with ``status`` after printing exactly one line
    to standard error, ``mcprof: error: ...``, and (with ``store``) that the store's files
    are unchanged. Return the message after ``mcprof: error: ``."""
    before = snapshot(store) if store is not None else None
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    _out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == status, err
    assert len(lines) == 1, err
    assert lines[0].startswith("mcprof: error: "), err
    if store is not None:
        assert snapshot(store) == before
    return lines[0].removeprefix("mcprof: error: ")


CAP_DAC_OVERRIDE = 1
"""The capability by which root writes through permission bits (linux/capability.h)."""
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _set_effective(capability: int, on: bool) -> None:
    """Raise or lower one capability in this thread's effective set, within its permitted
    set (lowering needs no privilege; raising it again needs it to be permitted)."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    word, bit = divmod(capability, 32)
    if on:
        data[word].effective |= 1 << bit
    else:
        data[word].effective &= ~(1 << bit)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


@contextmanager
def read_only(root: Path) -> Iterator[None]:
    """``root`` and everything under it cannot be written while inside: the write bits are
    cleared, and a root process (as CI runs the tests), whom bits do not stop, gives up
    ``CAP_DAC_OVERRIDE`` for the while. It stays root, so it still reads the package and
    the virtual environment wherever the checkout lives (a directory of mode 700 included),
    and every write it makes meets the bits as any user's would. The capability is the
    calling thread's; the writes the tests check are all made on it."""
    paths = [root, *root.rglob("*")]
    modes = {path: path.stat().st_mode for path in paths}
    for path, mode in modes.items():
        path.chmod(mode & ~0o222)
    as_root = os.geteuid() == 0
    if as_root:
        _set_effective(CAP_DAC_OVERRIDE, on=False)
    try:
        yield
    finally:
        if as_root:
            _set_effective(CAP_DAC_OVERRIDE, on=True)
        for path, mode in modes.items():
            path.chmod(mode)
