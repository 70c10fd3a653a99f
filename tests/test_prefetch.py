"""``prefetch.ahead``: items in order, the producer's error raised in the consumer, and a
consumer that stops early freeing the producer at once rather than after its wait for the
slot times out (every refused trace of several chunks waited for that, up to 0.1 s)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator

import pytest

from multicore_profiler import prefetch


def counting(made: list[int], closed: threading.Event) -> Generator[int, None, None]:
    """0, 1, 2, ... without end, each one appended to ``made``; ``closed`` set when the
    generator is closed."""
    try:
        item = 0
        while True:
            made.append(item)
            yield item
            item += 1
    finally:
        closed.set()


def test_items_come_in_order_and_an_error_comes_to_the_consumer() -> None:
    def failing() -> Generator[int, None, None]:
        yield 1
        yield 2
        raise ValueError("the third item cannot be made")

    items = prefetch.ahead(failing(), "test-ahead")
    assert [next(items), next(items)] == [1, 2]
    with pytest.raises(ValueError, match="the third item cannot be made"):
        next(items)


def test_a_consumer_that_stops_frees_the_waiting_producer_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full_waits = threading.Semaphore(0)
    timeouts: list[float] = []

    class Slots(queue.Queue):
        """The slot, telling when the producer waits on it full, and each wait that
        ended by timing out."""

        def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
            if self.full():
                full_waits.release()
            try:
                super().put(item, block, timeout)
            except queue.Full:
                timeouts.append(timeout or 0.0)
                raise

    monkeypatch.setattr(prefetch.queue, "Queue", Slots)
    made: list[int] = []
    closed = threading.Event()
    items = prefetch.ahead(counting(made, closed), "test-ahead")
    assert next(items) == 0
    # The producer waited for the slot with 1, then, 0 taken, waits with 2.
    for _ in range(2):
        assert full_waits.acquire(timeout=60), "the producer never waited on a full slot"
    items.close()  # joins the producer
    assert closed.is_set()
    assert timeouts == []
    # 0 taken, 1 in the slot, 2 waiting for it: nothing made after the stop.
    assert made == [0, 1, 2]
    assert not [t for t in threading.enumerate() if t.name == "test-ahead"]
