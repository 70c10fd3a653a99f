from __future__ import annotations

from pathlib import Path

import pytest

from multicore_profiler.storage.store import Store, open_store


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """A fresh, empty store in a temporary directory."""
    with open_store(tmp_path / "store") as opened:
        yield opened
