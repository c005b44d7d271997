"""Filter pushdown for batch reads of format s2 (PySpark 4.1+): real Spark on local[2]
against the local S2 server.

Every query runs twice, with spark.sql.python.filterPushdown.enabled on and off, and must
return exactly the same rows; the narrowed ranges are checked on the reader's partitions.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from _s2_target import s2_config

from s2_spark.s2 import AppendRecord, S2Client
from s2_spark.spark import S2DataSource
from s2_spark.spark._compat import HAS_FILTER_PUSHDOWN, SPARK_VERSION
from s2_spark.spark.partitions import PackedPartition, RangePartition

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        not HAS_FILTER_PUSHDOWN,
        reason=f"filter pushdown for Python data sources needs PySpark 4.1+; this is "
        f"{SPARK_VERSION}",
    ),
]

CONF = "spark.sql.python.filterPushdown.enabled"
T0 = 1_700_000_000_000  # epoch millis of the first record

# Stream "p-a": 30 records, three per millisecond, every other millisecond:
# seq_num i has timestamp T0 + 2 * (i // 3). Stream "p-b": 10 records at T0 + 5 + i.
# Stream "q-c" lies outside the prefix p-.
TS = {
    "p-a": [T0 + 2 * (i // 3) for i in range(30)],
    "p-b": [T0 + 5 + i for i in range(10)],
    "q-c": [T0 + i for i in range(5)],
}


def _ms(offset: int) -> str:
    return f"timestamp_millis({T0 + offset})"


def _us(offset_us: int) -> str:
    return f"timestamp_micros({T0 * 1000 + offset_us})"


class Env:
    """A basin with the three streams above, and reads of it."""

    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = S2Client(s2_config(url))
        self.basin = f"spark-pushdown-{uuid.uuid4().hex[:10]}"
        self.client.create_basin(self.basin)
        basin = self.client.basin(self.basin)
        for name, stamps in TS.items():
            basin.create_stream(name)
            records = [
                AppendRecord(f"{name}:{i}".encode(), headers=[(b"i", str(i).encode())],
                             timestamp=t)
                for i, t in enumerate(stamps)
            ]
            basin.stream(name).append_many(records)

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url, "basin": self.basin, **extra}

    def read(self, **opts: str) -> Any:
        return self.spark.read.format("s2").options(**self.options(**opts)).load()

    def reader(self, **opts: str) -> Any:
        """The batch reader Spark would plan with, built on the driver."""
        source = S2DataSource(self.options(**opts))
        return source.reader(source.schema())


@pytest.fixture(scope="module")
def env(target_s2: Any, spark: Any) -> Iterator[Env]:
    e = Env(target_s2.url, spark)
    yield e
    e.client.close()


@contextmanager
def pushdown(spark: Any, enabled: bool) -> Iterator[None]:
    before = spark.conf.get(CONF, None)
    spark.conf.set(CONF, "true" if enabled else "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(CONF)
        else:
            spark.conf.set(CONF, before)


Key = tuple[str, int, int, bytes]


def _rows(df: Any) -> list[Key]:
    return [
        (r["stream"], r["seq_num"], r["ts"], bytes(r["body"]))
        for r in df.selectExpr("stream", "seq_num", "unix_millis(timestamp) AS ts", "body")
        .collect()
    ]


def _collect_cases(env: Env, cases: dict[str, tuple[dict[str, str], str]]) -> dict[str, Any]:
    """Every case's rows, sorted, from one Spark job (a union tagged by case)."""
    from functools import reduce

    parts = [
        env.read(**opts).where(predicate).selectExpr(
            f"'{name}' AS case", "stream", "seq_num", "unix_millis(timestamp) AS ts", "body"
        )
        for name, (opts, predicate) in cases.items()
    ]
    out: dict[str, list[Key]] = {name: [] for name in cases}
    for r in reduce(lambda a, b: a.unionByName(b), parts).collect():
        out[r["case"]].append((r["stream"], r["seq_num"], r["ts"], bytes(r["body"])))
    return {name: sorted(rows) for name, rows in out.items()}


def _expected(streams: list[str], keep: Any) -> list[Key]:
    """The rows of `streams` whose (seq_num, millis) `keep` accepts."""
    return sorted(
        (s, i, t, f"{s}:{i}".encode())
        for s in streams
        for i, t in enumerate(TS[s])
        if keep(i, t)
    )


PREFIX = {"streamPrefix": "p-"}
ONE = {"stream": "p-a"}

# name -> (options, predicate). Comments: the rows the predicate keeps in p-a.
CASES: dict[str, tuple[dict[str, str], str]] = {
    "seq_gt": (PREFIX, "seq_num > 5"),
    "seq_ge": (PREFIX, "seq_num >= 5"),
    "seq_lt": (PREFIX, "seq_num < 5"),
    "seq_le": (PREFIX, "seq_num <= 5"),
    "seq_eq": (PREFIX, "seq_num = 5"),
    "seq_in": (PREFIX, "seq_num IN (3, 9, 12)"),
    "seq_past_tail": (PREFIX, "seq_num >= 100"),
    "seq_negative": (PREFIX, "seq_num > -3 AND seq_num < 2"),
    # T0+2 is seq_nums 3..5 of p-a; T0+3 lies between records of p-a.
    "ts_gt": (PREFIX, f"timestamp > {_ms(2)}"),
    "ts_ge": (PREFIX, f"timestamp >= {_ms(2)}"),
    "ts_lt": (PREFIX, f"timestamp < {_ms(2)}"),
    "ts_eq": (PREFIX, f"timestamp = {_ms(2)}"),
    "ts_eq_gap": (ONE, f"timestamp = {_ms(3)}"),
    "ts_ge_gap": (ONE, f"timestamp >= {_ms(3)}"),
    "ts_lt_gap": (ONE, f"timestamp < {_ms(3)}"),
    "ts_in": (PREFIX, f"timestamp IN ({_ms(2)}, {_ms(8)})"),
    # Microsecond bounds inside a millisecond: T0+2 ms + 500 us.
    "us_gt": (PREFIX, f"timestamp > {_us(2500)}"),
    "us_le": (PREFIX, f"timestamp <= {_us(2500)}"),
    "us_eq": (PREFIX, f"timestamp = {_us(2500)}"),
    "us_gt_just_below": (ONE, f"timestamp > {_us(1999)}"),
    "us_lt_just_above": (ONE, f"timestamp < {_us(2001)}"),
    "ts_before_all": (PREFIX, f"timestamp < {_ms(-1000)}"),
    "ts_after_all": (PREFIX, f"timestamp > {_ms(1000)}"),
    "ts_string_literal": (ONE, "timestamp >= '2023-11-14 22:13:20.004'"),
    "stream_eq": (PREFIX, "stream = 'p-b'"),
    "stream_in": (PREFIX, "stream IN ('p-a', 'q-c', 'p-missing')"),
    "stream_outside": (PREFIX, "stream = 'q-c'"),
    "stream_explicit": ({"streams": "p-a,q-c"}, "stream = 'q-c' AND seq_num >= 2"),
    "combined": (PREFIX, f"seq_num >= 3 AND timestamp < {_ms(9)} AND stream = 'p-b'"),
    "seq_and_ts": (ONE, f"seq_num < 20 AND timestamp >= {_ms(6)}"),
    "with_options": (
        {**ONE, "startingPosition": '{"p-a": 4}', "endingPosition": '{"p-a": 15}'},
        "seq_num > 2 AND seq_num < 10",
    ),
    "with_timestamp_options": (
        {**PREFIX, "startingPosition": f"timestamp:{T0 + 4}", "endingPosition": "latest"},
        f"timestamp <= {_ms(8)}",
    ),
    "or": (PREFIX, f"seq_num < 2 OR timestamp > {_ms(12)}"),
    "not": (PREFIX, "NOT (seq_num > 5)"),
    "expression": (PREFIX, "seq_num + 1 > 5 AND body LIKE 'p-a:2%'"),
}

# What some of the cases keep, independently of Spark: pins the boundaries.
EXPECTED = {
    "seq_gt": _expected(["p-a", "p-b"], lambda i, t: i > 5),
    "ts_gt": _expected(["p-a", "p-b"], lambda i, t: t > T0 + 2),
    "ts_eq_gap": [],
    "us_gt": _expected(["p-a", "p-b"], lambda i, t: t >= T0 + 3),
    "us_le": _expected(["p-a", "p-b"], lambda i, t: t <= T0 + 2),
    "us_eq": [],
    "us_gt_just_below": _expected(["p-a"], lambda i, t: t >= T0 + 2),
    "us_lt_just_above": _expected(["p-a"], lambda i, t: t <= T0 + 2),
    "stream_outside": [],
    "with_options": _expected(["p-a"], lambda i, t: 4 <= i < 10),
    "with_timestamp_options": _expected(["p-a", "p-b"], lambda i, t: T0 + 4 <= t <= T0 + 8),
}


def test_results_with_pushdown_equal_results_without(env: Env) -> None:
    with pushdown(env.spark, False):
        without = _collect_cases(env, CASES)
    with pushdown(env.spark, True):
        with_ = _collect_cases(env, CASES)
    for name in CASES:
        assert with_[name] == without[name], name
    for name, rows in EXPECTED.items():
        assert without[name] == rows, name
    # Most cases keep something: the comparison is not between empty results.
    assert sum(1 for rows in without.values() if rows) >= len(CASES) - 8


def _ranges(reader: Any) -> list[tuple[str, int, int]]:
    ranges = [r for p in reader.partitions()
              for r in (p.ranges if isinstance(p, PackedPartition) else (p,))]
    assert all(isinstance(r, RangePartition) for r in ranges)
    return [(r.stream, r.start, r.end) for r in ranges if r.stream]


def _push(reader: Any, filters: list[Any]) -> list[Any]:
    left = list(reader.pushFilters(filters))
    assert all(any(f is g for g in filters) for f in left)  # Spark wants them by identity
    return left


def _at(offset_ms: int, micros: int = 0) -> dt.datetime:
    return dt.datetime.fromtimestamp((T0 + offset_ms) / 1000, dt.UTC) + dt.timedelta(
        microseconds=micros
    )


def test_planned_ranges_are_narrowed(env: Env) -> None:
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
        Not,
        StringStartsWith,
    )

    # No filters: whole streams.
    assert _ranges(env.reader(**PREFIX)) == [("p-a", 0, 30), ("p-b", 0, 10)]

    # Timestamps: T0+2 ms is seq_nums 3..5 of p-a, seq_num 0 of p-b is at T0+5.
    reader = env.reader(**PREFIX)
    assert _push(reader, [GreaterThan(("timestamp",), _at(2))]) == []
    assert _ranges(reader) == [("p-a", 6, 30), ("p-b", 0, 10)]

    reader = env.reader(**PREFIX)
    assert _push(reader, [GreaterThanOrEqual(("timestamp",), _at(2, 500)),
                          LessThan(("timestamp",), _at(7))]) == []
    assert _ranges(reader) == [("p-a", 6, 12), ("p-b", 0, 2)]

    reader = env.reader(**PREFIX)
    assert _push(reader, [LessThanOrEqual(("timestamp",), _at(2, 999))]) == []
    assert _ranges(reader) == [("p-a", 0, 6)]  # p-b is empty: no partition

    # seq_num, stream, and what is not pushed.
    reader = env.reader(**PREFIX)
    seq_in = In(("seq_num",), (7, 3))
    others = [Not(EqualTo(("seq_num",), 4)), IsNotNull(("seq_num",)),
              StringStartsWith(("stream",), "p-"), EqualTo(("body",), b"p-a:3")]
    left = _push(reader, [EqualTo(("stream",), "p-a"), seq_in, *others])
    assert left == [seq_in, *others]  # IN only bounds the range: Spark checks it
    assert _ranges(reader) == [("p-a", 3, 8)]

    reader = env.reader(**PREFIX, startingPosition='{"p-b": 4}', endingPosition='{"p-a": 20}')
    assert _push(reader, [GreaterThan(("seq_num",), 2), LessThan(("seq_num",), 25),
                          In(("stream",), ("p-b", "p-a", "zzz"))]) == []
    assert _ranges(reader) == [("p-a", 3, 20), ("p-b", 4, 10)]

    reader = env.reader(**PREFIX)
    assert _push(reader, [GreaterThan(("seq_num",), 8), LessThan(("seq_num",), 3)]) == []
    assert _ranges(reader) == []
    assert "pushed=" in repr(reader) and "seq_num > 8" in repr(reader)


def test_explain_shows_pushed_filters_gone_from_the_filter(env: Env) -> None:
    def plan(df: Any) -> str:
        return str(df._jdf.queryExecution().executedPlan().toString())

    query = "seq_num >= 17 AND body LIKE '%x%'"
    with pushdown(env.spark, False):
        without = plan(env.read(**ONE).where(query))
    with pushdown(env.spark, True):
        with_ = plan(env.read(**ONE).where(query))
    assert ">= 17" in without
    assert ">= 17" not in with_  # pushed: Spark no longer evaluates it
    assert "x" in with_.split("BatchScan")[0]  # not pushed: still in the Filter
    assert "BatchScan s2" in with_


def test_reads_work_with_pushdown_off(env: Env) -> None:
    # PySpark 4.1+ refuses readers that implement pushFilters while the conf is off;
    # this one must read as before, Spark evaluating every filter.
    with pushdown(env.spark, False):
        assert _rows(env.read(**ONE).where("seq_num = 29")) == [
            ("p-a", 29, T0 + 18, b"p-a:29")
        ]


def test_durable_streams_push_nothing(ds_server: Any, spark: Any) -> None:
    from pyspark.sql.datasource import EqualTo, GreaterThan

    from s2_spark.durable import DurableStreamsClient
    from s2_spark.spark.durable.source import DurableStreamsDataSource

    client = DurableStreamsClient(base_url=ds_server.url)
    path = f"/pushdown/{uuid.uuid4().hex[:12]}"
    client.stream(path).create("application/json")
    client.stream(path).append_json([{"n": i} for i in range(6)])

    source = DurableStreamsDataSource({"baseUrl": ds_server.url, "stream": path})
    reader = source.reader(source.schema())
    filters = [EqualTo(("stream",), path), GreaterThan(("index",), 2)]
    assert list(reader.pushFilters(filters)) == filters

    def read() -> list[Any]:
        df = spark.read.format("durable-streams").options(baseUrl=ds_server.url, stream=path)
        return sorted(
            (r["index"], json.loads(r["value"])["n"])
            for r in df.load().where(f"stream = '{path}' AND index > 2").collect()
        )

    with pushdown(spark, True):
        assert read() == [(3, 3), (4, 4), (5, 5)]
    with pushdown(spark, False):
        assert read() == [(3, 3), (4, 4), (5, 5)]
