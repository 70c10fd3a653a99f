"""Progress bars for long work, shown on a terminal only: a tqdm bar where standard error
is a terminal (where tqdm's ``disable=None`` draws one) and otherwise a stand-in that draws
nothing, so that a job's process, a pipe or CI never imports tqdm (about 20 ms of every
command's start-up). Imports nothing of the package, so every room may use it."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, Protocol


class Bar(Protocol):
    """What the package's code uses of a bar it is handed."""

    total: float | None

    def update(self, n: float = 1) -> bool | None: ...

    def refresh(self) -> None: ...


def progress(iterable: Iterable[Any] | None = None, **options: Any) -> Any:
    """A tqdm bar over ``iterable`` (or updated by hand) with tqdm's ``options`` (``desc``,
    ``unit``, ``total``, ...) when standard error is a terminal; else a ``Quiet`` one."""
    if not sys.stderr.isatty():
        return Quiet(iterable, options.get("total"))
    from tqdm import tqdm  # on a terminal only

    return tqdm(iterable, disable=None, **options)


class Quiet:
    """A progress bar that draws nothing, with what callers use of tqdm's: iteration over
    its iterable, ``update``, ``refresh``, a ``total`` to add to, and use as a context."""

    def __init__(self, iterable: Iterable[Any] | None, total: float | None) -> None:
        self._iterable = iterable
        self.total = total

    def __iter__(self) -> Iterator[Any]:
        return iter(() if self._iterable is None else self._iterable)

    def __enter__(self) -> Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: float = 1) -> None:
        """Count nothing: nobody looks."""

    def refresh(self) -> None:
        """Draw nothing."""
