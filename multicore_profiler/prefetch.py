"""Items made one ahead on a thread of their own, for a consumer whose work and the
producer's release the GIL (numpy, DuckDB): the trace reader decodes the next chunk while
this one becomes columns, the Perfetto writer's timeline makes the next group while this
one is encoded. Imports nothing of the package, so every room may use it."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Generator, Iterator
from typing import TypeVar

T = TypeVar("T")

_DONE = object()


def ahead(items: Generator[T, None, None], name: str) -> Iterator[T]:
    """``items``, produced one ahead on a thread named ``name``; the producer's exceptions
    are raised in the consumer's loop.

    Closing this generator (or its end, or an error on either side) stops the thread and
    closes ``items``; it is joined unless the close runs on that thread itself (the garbage
    collector may finalize an abandoned generator on any thread)."""
    slots: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def offer(entry: tuple[object, BaseException | None]) -> bool:
        """Hand ``entry`` to the consumer unless it has stopped; whether it was handed (a
        consumer that stops takes what waits in the slot, so that a blocked offer ends at
        once, and is then told so)."""
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.1)
                return not stop.is_set()
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer((item, None)):
                    return
            offer((_DONE, None))
        except BaseException as exc:  # handed to the consumer, raised there
            offer((_DONE, exc))
        finally:
            items.close()

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()
    try:
        while True:
            item, error = slots.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            slots.get_nowait()  # frees a producer waiting for the slot
        if threading.current_thread() is not worker:
            worker.join()
