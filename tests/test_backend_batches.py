"""Shaping range reads for Spark: coalescing batches and reading ahead in a thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from s2_spark.backends._batches import coalesced, read_ahead


def batch(start: int, n: int, body: bytes = b"x") -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"seq_num": pa.array(range(start, start + n), pa.int64()), "body": [body] * n})


def test_coalesced_keeps_rows_in_order_in_bigger_batches() -> None:
    parts = [batch(0, 3), batch(3, 0), batch(3, 4), batch(7, 1), batch(8, 5), batch(13, 2)]
    out = list(coalesced(iter(parts), rows=5, nbytes=1 << 30))
    assert [b.num_rows for b in out] == [7, 6, 2]
    assert [n for b in out for n in b.column("seq_num").to_pylist()] == list(range(15))


def test_coalesced_yields_at_the_byte_budget() -> None:
    big = [batch(i * 2, 2, b"y" * 1000) for i in range(4)]
    out = list(coalesced(iter(big), rows=1000, nbytes=3000))
    assert [b.num_rows for b in out] == [4, 4]


def test_a_single_batch_passes_through_uncopied() -> None:
    only = batch(0, 10)
    assert next(coalesced(iter([only]), rows=5)) is only


def test_read_ahead_keeps_order_then_raises_the_producers_error() -> None:
    def produce() -> Iterator[int]:
        yield from range(5)
        raise ValueError("boom")

    got: list[int] = []
    with pytest.raises(ValueError, match="boom"):
        for item in read_ahead(produce, depth=2):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]


def test_closing_read_ahead_closes_the_producer() -> None:
    closed = threading.Event()

    def produce() -> Iterator[int]:
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    items = read_ahead(produce, depth=1)
    assert [next(items), next(items)] == [0, 1]
    items.close()  # type: ignore[attr-defined]
    assert closed.is_set()
