"""The `s2` writer when a replayed micro-batch gives its partitions the same rows in
another order (as after a streaming shuffle): real queries against the local S2 server,
SIGKILLed between appends and restarted from their checkpoint.

The source is `_shuffled_source` (format "shuffled", test only): the same rows for the
same offsets, in a new order on every read, with identical rows, rows alike but for a
header, given and null timestamps. Every task writes 100 rows to each of 3 streams per
micro-batch in appends of 10, so a kill lands part of a (task, stream)'s rows and the
replay finds them in another order. Asserted: every stream holds each row exactly once
(identical rows counted), and a replay whose rows differ fails naming the stream.
"""

from __future__ import annotations

import random
import sys
import textwrap
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _child import kill_at_marker
from _records import data_records
from _soak import soak_rounds
from _versions import needs_admission_control

from s2_spark.s2 import S2Client, S2Config

pytestmark = [pytest.mark.spark, needs_admission_control]

PER_BATCH, BATCHES, STREAMS = 600, 2, 3  # the second test fails in micro-batch 1
TOTAL = PER_BATCH * BATCHES
PREFIX = "o/"


def start_query(spark: Any, url: str, basin: str, checkpoint: str, *, fault: str | None = None,
                variant: int = 0) -> Any:
    """The query under test: format "shuffled" (2 partitions of 300 rows a micro-batch)
    into streams o/0..o/2, appends of 10 rows, `trigger(availableNow=True)`."""
    df = (spark.readStream.format("shuffled").option("total", str(TOTAL))
          .option("perBatch", str(PER_BATCH)).option("streams", str(STREAMS))
          .option("prefix", PREFIX).option("variant", str(variant)).load())
    w = (df.writeStream.format("s2").option("endpoint", url).option("basin", basin)
         .option("createStreams", "true").option("maxRecordsPerAppend", "10")
         .option("checkpointLocation", checkpoint).trigger(availableNow=True))
    if fault is not None:
        w = w.option("_testFaultAfterAppends", fault)
    return w.start()


CHILD = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    tests, url, basin, ckpt, cores, fault = sys.argv[1:7]
    sys.path.insert(0, tests)
    from pyspark.sql import SparkSession
    from _shuffled_source import register
    from test_spark_writer_reorder import start_query
    spark = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    start_query(spark, url, basin, ckpt, fault=None if fault == "-" else fault).awaitTermination()
""")


@pytest.fixture(scope="module")
def shuffled(spark: Any) -> Any:
    from _shuffled_source import register

    register(spark)
    return spark


@pytest.fixture
def target(s2_server: Any) -> Iterator[str]:
    basin = f"reorder-{uuid.uuid4().hex[:8]}"
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        client.create_basin(basin)
    yield basin


def stream_rows(url: str, basin: str) -> dict[str, Counter[tuple[Any, ...]]]:
    """Each target stream's data records (body, headers) as a multiset."""
    with S2Client(S2Config(endpoint=url)) as client:
        return {name: Counter((body, tuple(headers)) for body, headers, _ in
                              data_records(client.basin(basin).stream(name)))
                for name in (f"{PREFIX}{k}" for k in range(STREAMS))}


def child_args(url: str, basin: str, checkpoint: str, cores: int) -> list[str]:
    script = Path(checkpoint).with_suffix(".py")
    script.write_text(CHILD)
    return [sys.executable, str(script), str(Path(__file__).parent), url, basin, checkpoint,
            str(cores)]


def test_reordered_replays_after_random_kills_write_each_row_once(
    shuffled: Any, s2_server: Any, target: str, tmp_path: Path
) -> None:
    """Runs SIGKILLed (driver, JVM, workers) with a task hung right after a random append
    of a random micro-batch, on local[1] (then local[3], local[1], ...: one run in the
    suite, `soak_rounds()` in a soak); every restart replays the killed micro-batch in a
    new order. The last run (the session's local[2]) finishes: each stream holds each of
    its rows exactly once."""
    from _shuffled_source import expected

    ckpt = str(tmp_path / "ckpt")
    rng = random.Random(38)
    for k in range(soak_rounds()):
        cores = (1, 3)[k % 2]
        marker = str(tmp_path / f"killed-{k}")
        fault = f"hang:{rng.randint(1, 30)}:{rng.randint(0, BATCHES - 1)}:{marker}"
        try:
            kill_at_marker([*child_args(s2_server.url, target, ckpt, cores), fault], marker,
                           timeout=480)
        except AssertionError as exc:
            # The chosen micro-batch had been written before this run: it ends.
            assert "ended before the fault point" in str(exc), exc
    q = start_query(shuffled, s2_server.url, target, ckpt)
    assert q.awaitTermination(480), "the last run did not finish"
    assert q.exception() is None, str(q.exception())
    want = expected(TOTAL, streams=STREAMS, prefix=PREFIX)
    got = stream_rows(s2_server.url, target)
    for name in want:
        assert got[name] == want[name], (name, got[name] - want[name], want[name] - got[name])


def test_replay_of_other_rows_fails_naming_the_stream(
    shuffled: Any, s2_server: Any, target: str, tmp_path: Path
) -> None:
    """A task fails after 15 appends of micro-batch 1 and the query stops; restarted over
    a source whose rows for those offsets differ (every fourth body), the replay fails,
    saying that its rows are not the rows written and naming the stream."""
    from pyspark.errors import StreamingQueryException

    ckpt = str(tmp_path / "ckpt")
    marker = str(tmp_path / "failed")
    for variant, fault, error in [(0, f"fail:15:1:{marker}", "injected failure"),
                                  (1, None, "ReplayMismatchError")]:
        q = start_query(shuffled, s2_server.url, target, ckpt, fault=fault, variant=variant)
        with pytest.raises(StreamingQueryException):
            q.awaitTermination(240)
        assert error in str(q.exception())
    text = str(q.exception())
    assert "not the rows that attempt wrote" in text
    assert f"stream '{PREFIX}" in text and f"in basin '{target}'" in text
