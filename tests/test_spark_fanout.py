"""A streaming fan-out: every task of every micro-batch writes a stream per user.

Real queries against the local S2 server. One source stream of events is read with
`minPartitions=2`, so both tasks of each micro-batch hold events of nearly every user,
and each event is routed to its user's stream (`u/<user>`). Asserted: each (task,
stream) costs one append once the run holds the stream, and under SIGKILLs at random
points (a task hung between its appends, or a timer), with restarts on `local[1]` to
`local[3]`, every user's stream holds each of its events exactly once, micro-batches in
order and each task's events in input order.
"""

from __future__ import annotations

import random
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _child import kill_at_marker, kill_once
from _soak import soak_rounds
from _versions import needs_admission_control

from s2_spark.errors import NotFoundError
from s2_spark.s2 import AppendRecord, S2Client, S2Config

pytestmark = pytest.mark.spark

PER_TRIGGER = 600


def events(n: int, users: int) -> list[bytes]:
    """Event i belongs to user (i * 7919) % users: "<user>:<i>"."""
    return [f"{(i * 7919) % users:03d}:{i}".encode() for i in range(n)]


def fill(url: str, basin: str, stream: str, bodies: list[bytes]) -> None:
    with S2Client(S2Config(endpoint=url)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream(stream)
        client.basin(basin).stream(stream).append_many([AppendRecord(b) for b in bodies])


def user_streams(url: str, basin: str, users: int) -> dict[int, list[int]]:
    """Each user's stream as the event numbers it holds, in order (missing: empty)."""
    out: dict[int, list[int]] = {}
    with S2Client(S2Config(endpoint=url)) as client:
        for u in range(users):
            stream = client.basin(basin).stream(f"u/{u:03d}")
            got: list[int] = []
            try:
                tail = stream.check_tail().seq_num
            except NotFoundError:
                tail = 0
            pos = 0
            while pos < tail:
                d = stream.read(seq_num=pos, count=1000, include_command_records=False)
                if d.count == 0:
                    break
                got += [int(b.split(b":")[1]) for b in d.batch.column("body").to_pylist()]
                pos = int(d.last_seq_num) + 1
            out[u] = got
    return out


def assert_fanned_out_once(got: dict[int, list[int]], n: int, users: int) -> None:
    """Each user's events once; micro-batches in order; each task's (a micro-batch's
    half, with minPartitions=2) events in input order."""
    for u in range(users):
        want = [i for i in range(n) if (i * 7919) % users == u]
        assert sorted(got[u]) == want, u
        batches = [i // PER_TRIGGER for i in got[u]]
        assert batches == sorted(batches), u
        for task in {(i // PER_TRIGGER, (i % PER_TRIGGER) * 2 // PER_TRIGGER) for i in want}:
            mine = [i for i in got[u]
                    if (i // PER_TRIGGER, (i % PER_TRIGGER) * 2 // PER_TRIGGER) == task]
            assert mine == sorted(mine), (u, task)


def fanout_frame(spark: Any, url: str, src_basin: str) -> Any:
    from pyspark.sql import functions as F

    df = (spark.readStream.format("s2").option("endpoint", url).option("basin", src_basin)
          .option("stream", "events").option("minPartitions", "2")
          .option("maxRecordsPerTrigger", str(PER_TRIGGER)).load())
    user = F.substring(F.col("body").cast("string"), 1, 3)
    return df.select(F.concat(F.lit("u/"), user).alias("stream"), "body")


def micro_batches_planned(checkpoint: str) -> int:
    """Micro-batches a query's checkpoint has offsets for (Spark logs them as a
    micro-batch starts, before its tasks)."""
    offsets = Path(checkpoint) / "offsets"
    return sum(1 for f in offsets.iterdir() if f.name.isdigit()) if offsets.is_dir() else 0


@pytest.fixture
def basins(s2_server: Any) -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:8]
    yield f"fan-src-{tag}", f"fan-dst-{tag}"


@pytest.mark.local_server  # counts the local server's appends
@needs_admission_control
def test_each_task_appends_once_per_stream(
    spark: Any, s2_server: Any, basins: tuple[str, str], tmp_path: Path
) -> None:
    """3 micro-batches of 600 events over 200 users, 2 tasks each: every (micro-batch,
    task, stream) with events costs exactly one append; the only refused appends are a
    task's first append to a stream the other task created and wrote a moment before (at
    most one per stream, in micro-batch 0)."""
    n, users = 3 * PER_TRIGGER, 200
    src, dst = basins
    fill(s2_server.url, src, "events", events(n, users))
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        client.create_basin(dst)
    before = s2_server.append_counts()
    q = (fanout_frame(spark, s2_server.url, src).writeStream.format("s2")
         .option("endpoint", s2_server.url).option("basin", dst)
         .option("createStreams", "true").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(240), "the query did not finish"
    assert q.exception() is None, str(q.exception())
    after = s2_server.append_counts()
    assert_fanned_out_once(user_streams(s2_server.url, dst, users), n, users)
    pairs = {(i // PER_TRIGGER, (i % PER_TRIGGER) * 2 // PER_TRIGGER, (i * 7919) % users)
             for i in range(n)}
    refused = after.get("refused", 0) - before.get("refused", 0)
    landed = after["landed"] - before["landed"]
    assert refused <= users
    assert landed == len(pairs)


KILL_CHILD = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    tests, url, src, dst, ckpt, cores, fault = sys.argv[1:8]
    sys.path.insert(0, tests)
    from pyspark.sql import SparkSession
    from test_spark_fanout import fanout_frame
    spark = (SparkSession.builder.master(f"local[{cores}]").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    w = (fanout_frame(spark, url, src).writeStream.format("s2").option("endpoint", url)
         .option("basin", dst).option("createStreams", "true")
         .option("checkpointLocation", ckpt).trigger(availableNow=True))
    if fault != "-":
        w = w.option("_testFaultAfterAppends", fault)
    w.start().awaitTermination()
""")


@needs_admission_control
def test_fanout_survives_random_kills_on_other_cluster_sizes(
    spark: Any, s2_server: Any, basins: tuple[str, str], tmp_path: Path
) -> None:
    """5 micro-batches of 600 events over 300 users, 2 tasks each. Runs are SIGKILLed
    (driver, JVM, workers) in turn: on local[1] with a task hung right after a random
    append of a random micro-batch, on local[3] at a random moment of the first
    micro-batch it plans (0-3 s after Spark logged its offsets; both in the suite,
    `soak_rounds()` in a soak); a last run on the session's local[2] finishes. Every
    user's stream holds each of its events once."""
    batches, users = 5, 300
    n = batches * PER_TRIGGER
    src, dst = basins
    fill(s2_server.url, src, "events", events(n, users))
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        client.create_basin(dst)
    script, ckpt = tmp_path / "child.py", str(tmp_path / "ckpt")
    script.write_text(KILL_CHILD)
    rng = random.Random(28)
    for k in range(soak_rounds(2)):
        args = [sys.executable, str(script), str(Path(__file__).parent), s2_server.url,
                src, dst, ckpt, str(1 + 2 * (k % 2))]
        if k % 2 == 0:  # a task hung at a fault point
            marker = str(tmp_path / f"killed-{k}")
            fault = f"hang:{rng.randint(1, 40)}:{rng.randint(0, batches - 1)}:{marker}"
            try:
                kill_at_marker([*args, fault], marker, timeout=480)
            except AssertionError as exc:
                # The chosen micro-batch had been written before this run: it ends.
                assert "ended before the fault point" in str(exc), exc
        else:  # a random moment of the run's first new micro-batch
            planned = micro_batches_planned(ckpt)
            kill_once([*args, "-"], lambda p=planned: micro_batches_planned(ckpt) > p,
                      rng.uniform(0.0, 3.0))
    q = (fanout_frame(spark, s2_server.url, src).writeStream.format("s2")
         .option("endpoint", s2_server.url).option("basin", dst)
         .option("createStreams", "true").option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    assert q.awaitTermination(300), "the last run did not finish"
    assert q.exception() is None, str(q.exception())
    assert_fanned_out_once(user_streams(s2_server.url, dst, users), n, users)
