"""Shared checks of the hostile-input corpus (``tests/test_hostile_*.py``): a bad input
ends in exactly one ``mcprof: error: ...`` line, the exit status, and a store whose
files and bytes are what they were."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from multicore_profiler.cli import main


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (the store), relative path -> SHA-256 of its bytes."""
    if not root.exists():
        return {}
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
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
