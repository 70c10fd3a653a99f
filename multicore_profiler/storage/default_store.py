"""Where a store is when none is named: ``$MCPROF_STORE``, else ``./mcprof-store``.

A module of its own, importing no library, so that a command line can show and take the
default before (or without) importing the store.
"""

from __future__ import annotations

import os

STORE_ENV = "MCPROF_STORE"
DEFAULT_STORE = "mcprof-store"


def default_store_path() -> str:
    """``$MCPROF_STORE`` (a path or URI) if set, else ``./mcprof-store``."""
    return os.environ.get(STORE_ENV) or DEFAULT_STORE
