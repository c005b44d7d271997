"""The floor of Spark's Python Data Source API: a source and a sink that do nothing but what
Spark asks of every Python source and sink, in a module that imports only pyspark's own,
so that a planner interpreter that unpickles them pays only for what Spark itself needs.

* `TrivialSink` (`format("trivial-sink")`): an Arrow stream writer that consumes each batch
  and keeps nothing; `commit` does nothing.
* `TrivialSource` (`format("trivial-source")`): `rows_per_second` rows a second since the
  query started, as (n bigint, body binary), planned by the clock: one partition a
  micro-batch, rows made from their numbers.

With option `freezeHeap` true, each call Spark makes of them freezes the calling
interpreter's heap once (`gc.freeze`), as `s2_spark.spark._worker_heap` does for ours:
the floor of a source or sink whose workers keep their heap out of the `gc.collect()`
Spark's daemon runs after every call.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)

__all__ = ["TrivialSink", "TrivialSource"]

_frozen = False


def _freeze(options: Mapping[str, str]) -> bool:
    """Freeze this interpreter's heap once if the options say so; whether they do."""
    global _frozen
    wanted = options.get("freezeHeap", "false") == "true"
    if wanted and not _frozen:
        gc.collect()
        gc.freeze()
        _frozen = True
    return wanted


class TrivialSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "trivial-sink"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return _Discard(_freeze(self.options))


class _Discard(DataSourceStreamArrowWriter):
    def __init__(self, freeze: bool) -> None:
        self.freeze = freeze

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for batch in iterator:
            batch.num_rows  # noqa: B018 - consume, like a writer that encodes and sends
        if self.freeze:
            _freeze({"freezeHeap": "true"})
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class TrivialSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "trivial-source"

    def schema(self) -> str:
        return "n bigint, body binary"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _ByTheClock(float(self.options.get("rows_per_second", "5")),
                           _freeze(self.options))


class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end


class _ByTheClock(DataSourceStreamReader):
    def __init__(self, rate: float, freeze: bool) -> None:
        self.rate = rate
        self.freeze = freeze
        self.t0 = time.time()

    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"n": int((time.time() - self.t0) * self.rate)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [_Range(start["n"], end["n"])] if end["n"] > start["n"] else []

    def read(self, partition: InputPartition) -> Iterator[tuple[int, bytes]]:
        assert isinstance(partition, _Range)
        for n in range(partition.start, partition.end):
            yield n, b"%100d" % n
        if self.freeze:
            _freeze({"freezeHeap": "true"})

    def commit(self, end: dict[str, int]) -> None:
        pass
