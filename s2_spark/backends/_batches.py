"""Shaping a range read's Arrow output for Spark: bigger batches, read ahead in a thread.

Spark pays a fixed cost per Arrow batch a Python source yields (IPC framing, a JVM
columnar batch, row iteration set-up), large next to a 1000-record S2 ReadBatch, so
`coalesced` merges consecutive batches up to a row and a byte budget. `read_ahead`
overlaps the network read and decoding (mostly GIL-free: socket reads, the C decoder,
Arrow concatenation) with Spark serializing the previous batch. Both hold at most a
fixed number of batches, so a task's memory does not grow with the length of its range.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import pyarrow as pa

__all__ = [
    "COALESCE_BYTES",
    "COALESCE_ROWS",
    "READ_AHEAD",
    "ReadAhead",
    "coalesced",
    "read_ahead",
    "read_in_order",
]

COALESCE_ROWS = 8192
"""Rows per yielded batch (at least; one more ReadBatch may tip it over)."""
COALESCE_BYTES = 8 * 1024 * 1024
"""Arrow buffer bytes after which a batch is yielded whatever its row count."""
READ_AHEAD = 2
"""Batches the reader thread may hold ready beyond the one Spark is serializing."""

T = TypeVar("T")
_END = object()


def coalesced(
    batches: Iterator[pa.RecordBatch],
    rows: int = COALESCE_ROWS,
    nbytes: int = COALESCE_BYTES,
) -> Iterator[pa.RecordBatch]:
    """The same rows in the same order, in batches of about `rows` rows or `nbytes` bytes."""
    pending: list[pa.RecordBatch] = []
    held_rows = held_bytes = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        pending.append(batch)
        held_rows += batch.num_rows
        held_bytes += _buffer_bytes(batch)
        if held_rows >= rows or held_bytes >= nbytes:
            yield _merge(pending)
            pending, held_rows, held_bytes = [], 0, 0
    if pending:
        yield _merge(pending)


def _buffer_bytes(batch: pa.RecordBatch) -> int:
    """The size of the batch's buffers (a slice counts them whole): `nbytes` works out
    the bytes each array references, 70 us for a 1000-row batch, where this is 0.5 us
    (pyarrow 13+; older ones have only `nbytes`)."""
    total = getattr(batch, "get_total_buffer_size", None)
    return int(total()) if total is not None else int(batch.nbytes)


def _merge(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


class ReadAhead(Iterator[T]):
    """`produce()` iterated in a daemon thread from construction on, at most `depth` items
    ahead of the caller. Its exceptions are raised to the caller, in order. `close()`
    stops it at its next item, which closes the inner iterator (and its HTTP response)."""

    def __init__(self, produce: Callable[[], Iterator[T]], depth: int = READ_AHEAD) -> None:
        self._items: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(depth)
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._done = False
        threading.Thread(target=functools.partial(self._run, produce),
                         name="s2-spark-read-ahead", daemon=True).start()

    def _put(self, item: object, error: BaseException | None = None) -> bool:
        while not self._stop.is_set():
            try:
                self._items.put((item, error), timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, produce: Callable[[], Iterator[T]]) -> None:
        it: Iterator[T] | None = None
        try:
            it = produce()
            for item in it:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_END, exc)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
            self._finished.set()

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item, error = self._items.get()
        if error is not None or item is _END:
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return item  # type: ignore[return-value]

    def stop(self) -> None:
        """Ask the thread to stop at its next item, without waiting for it."""
        self._done = True
        self._stop.set()

    def close(self) -> None:
        self.stop()
        self._finished.wait(timeout=5.0)


def read_ahead(produce: Callable[[], Iterator[T]], depth: int = READ_AHEAD) -> Iterator[T]:
    """`produce()`'s items, read `depth` ahead in a thread (see `ReadAhead`); closing
    this generator early stops the thread."""
    ahead = ReadAhead(produce, depth)
    try:
        yield from ahead
    finally:
        ahead.close()


def read_in_order(
    sources: Sequence[Callable[[], Iterator[T]]],
    *,
    ahead: int,
    prefetch: Callable[[int], bool],
) -> Iterator[T]:
    """The items of every source, source after source, as if read one by one.

    Meanwhile up to `ahead` of the sources that follow the current one and that
    `prefetch(index)` allows (small ones: each is read whole, into a list) are already
    being read by a pool of `ahead` threads; the rest are read when their turn comes.
    Memory stays bounded (`ahead` small sources) and the order is exactly the sources'
    order; a source's failure is raised when its turn comes. One future per small source:
    a read-ahead thread with its queue per source cost more than reading it.
    """
    if ahead < 1:
        for source in sources:
            yield from source()
        return
    pending: dict[int, Future[list[T]]] = {}
    queued = 0  # sources before this index were started or passed over
    pool = ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="s2-spark-read")
    try:
        for i, source in enumerate(sources):
            queued = max(queued, i + 1)
            while queued < len(sources) and len(pending) < ahead:
                if prefetch(queued):
                    pending[queued] = pool.submit(_whole, sources[queued])
                queued += 1
            done = pending.pop(i, None)
            if done is None:
                yield from source()
            else:
                yield from done.result()
    finally:
        for future in pending.values():
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)


def _whole(source: Callable[[], Iterator[T]]) -> list[T]:
    return list(source())
