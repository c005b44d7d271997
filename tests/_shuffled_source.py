"""Test only: a streaming source that replays a micro-batch with the same rows in another
order, as a shuffle's fetch order may (format "shuffled", PySpark 4.2+).

Offsets are row numbers; each micro-batch is `perBatch` rows, split into `partitions`
input partitions by offset (so a replay on any cluster size gets the same rows in each
partition). Every `read` of a partition yields its rows in a new random order. Row i:

* stream `<prefix><(i // 5) % streams>` (rows go to streams in groups of five);
* body `b<i>`, except that row i with i % 5 == 4 repeats row i - 1's body: rows 3 and 4
  of a group are identical (body, headers and timestamp), rows 8 and 9 differ in their
  header only;
* headers `[("h", "x")]` (`"y"` for i % 10 == 9);
* timestamp `t0 + i` milliseconds for groups of even number, null for the others (a
  duplicate gets its twin's).

`variant` other than 0 changes the bodies of every fourth row (`b<i>~<variant>`): the same
offsets then give different rows, as a source that is not deterministic would.
"""

from __future__ import annotations

import itertools
import os
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

SCHEMA = ("stream string, body binary, headers array<struct<name: binary, value: binary>>, "
          "timestamp bigint")
T0 = 1_700_000_000_000

Row = tuple[str, bytes, list[tuple[bytes, bytes]], int | None]


def row(i: int, *, streams: int, prefix: str, variant: int = 0) -> Row:
    """Row `i` of the source, as described in the module docstring."""
    twin = i - 1 if i % 5 == 4 else i
    body = f"b{twin}" + (f"~{variant}" if variant and twin % 4 == 0 else "")
    value = b"y" if i % 10 == 9 else b"x"
    stamp = T0 + twin if (i // 5) % 2 == 0 else None
    return f"{prefix}{(i // 5) % streams}", body.encode(), [(b"h", value)], stamp


def expected(total: int, *, streams: int, prefix: str) -> dict[str, Counter[tuple[Any, ...]]]:
    """Each stream's rows (body, headers) as a multiset."""
    out: dict[str, Counter[tuple[Any, ...]]] = {}
    for i in range(total):
        stream, body, headers, _ = row(i, streams=streams, prefix=prefix)
        out.setdefault(stream, Counter())[(body, tuple(headers))] += 1
    return out


class _Range(InputPartition):
    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi


class ShuffledStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.total = int(options["total"])
        self.per_batch = int(options["perBatch"])
        self.partitions_n = int(options.get("partitions", "2"))
        self.streams = int(options.get("streams", "3"))
        self.prefix = options.get("prefix", "o/")
        self.variant = int(options.get("variant", "0"))

    def initialOffset(self) -> dict[str, int]:
        return {"row": 0}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # type: ignore[override]
        return {"row": min(self.total, start["row"] + self.per_batch)}

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        lo, hi = start["row"], end["row"]
        n = self.partitions_n
        cuts = [lo + (hi - lo) * k // n for k in range(n + 1)]
        return [_Range(a, b) for a, b in itertools.pairwise(cuts) if b > a]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        order = list(range(partition.lo, partition.hi))
        random.Random(os.urandom(8)).shuffle(order)  # another order on every read
        for i in order:
            stream, body, headers, stamp = row(i, streams=self.streams, prefix=self.prefix,
                                               variant=self.variant)
            yield stream, body, headers, stamp

    def commit(self, end: dict[str, int]) -> None:
        return None


class ShuffledSource(DataSource):
    """Format "shuffled" (test only): see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "shuffled"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return ShuffledStreamReader(self.options)


def register(spark: Any) -> None:
    """Register format "shuffled" in `spark`, its classes pickled by value (Spark's
    Python workers cannot import this test module)."""
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(ShuffledSource)
