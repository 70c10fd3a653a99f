"""What the store's maintenance and claims use of a ``Store``, as a protocol.

``store.py`` imports compaction, retention and the rest to offer them as methods; they
take the store they work on as a ``StoreHandle``, so none of them imports ``store.py``
back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import duckdb
import numpy as np
import pyarrow as pa

from multicore_profiler.storage.location import StoreLocation
from multicore_profiler.storage.schema import TableSpec
from multicore_profiler.storage.swap import StoreLock


class StoreHandle(Protocol):
    """A store's location, lock, queries and committed ids (``Store`` provides them)."""

    @property
    def location(self) -> StoreLocation: ...

    @property
    def uri(self) -> str: ...

    @property
    def root(self) -> Path: ...

    @property
    def lock(self) -> StoreLock: ...

    def sql(
        self,
        query: str,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        runs: Sequence[str] | None = None,
    ) -> pa.Table: ...

    def reading(
        self,
        *,
        modules: Sequence[str] = (),
        runs: Sequence[str] | None = None,
        files: Mapping[str, Sequence[str]] | None = None,
    ) -> AbstractContextManager[duckdb.DuckDBPyConnection]: ...

    def invocation_ids(self, run_id: str, rank: int) -> np.ndarray: ...

    def verified_file(self, spec: TableSpec, path: str, *, keep: bool = True) -> pa.Table: ...

    def save_verified(self) -> None: ...
