"""Shaping a range read's Arrow output for Spark: bigger batches, read ahead in a thread.

Spark pays a fixed cost per Arrow batch a Python source yields (IPC framing, a JVM
columnar batch, row iteration set-up), large next to a 1000-record S2 ReadBatch, so
`coalesced` merges consecutive batches up to a row and a byte budget. `read_ahead`
overlaps the network read and decoding (mostly GIL-free: socket reads, the C decoder,
Arrow concatenation) with Spark serializing the previous batch. Both hold at most a
fixed number of batches, so a task's memory does not grow with the length of its range.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import pyarrow as pa

__all__ = ["COALESCE_BYTES", "COALESCE_ROWS", "READ_AHEAD", "coalesced", "read_ahead"]

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
        held_bytes += batch.nbytes
        if held_rows >= rows or held_bytes >= nbytes:
            yield _merge(pending)
            pending, held_rows, held_bytes = [], 0, 0
    if pending:
        yield _merge(pending)


def _merge(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def read_ahead(produce: Callable[[], Iterator[T]], depth: int = READ_AHEAD) -> Iterator[T]:
    """Iterate `produce()` in a daemon thread, at most `depth` items ahead of the caller.

    Its exceptions are raised here, in order. Closing this generator early stops the
    thread at its next item, which closes the inner iterator (and its HTTP response).
    """
    items: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object, error: BaseException | None = None) -> bool:
        while not stop.is_set():
            try:
                items.put((item, error), timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        it = produce()
        try:
            for item in it:
                if not put(item):
                    return
            put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            put(_END, exc)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="s2-spark-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = items.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        thread.join(timeout=5.0)
