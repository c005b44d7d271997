"""Many small streams read like a few: packed partitions, ranges read concurrently inside a
task, a tail watch instead of per-trigger lookups, and exact replay of packed micro-batches
on a cluster of another size. Real queries on local[N] against the local S2 server."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _versions import HAS_ADMISSION_CONTROL, needs_admission_control, plan_all_available

from s2_spark.backends.s2 import S2Backend, S2Settings
from s2_spark.backends.s2 import backend as s2_backend
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.spark._read_task import read_partition
from s2_spark.spark.options import parse_read_options
from s2_spark.spark.partitions import PackedPartition, RangePartition
from s2_spark.spark.s2.source import S2_READ_FORMAT, S2DataSource


class Env:
    """A basin of many small streams named `<prefix><k>`, and read-back helpers. Its reads
    ask for zstd and its writes for gzip, as on a real network (on loopback the default is
    none): the server compresses the answers of 1 KiB or more, as s2-lite does."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = S2Client(S2Config(endpoint=url, compression="gzip"))
        self.basin = f"many-{uuid.uuid4().hex[:10]}"
        self.client.create_basin(self.basin)

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url, "basin": self.basin, "compression": "zstd", **extra}

    def fill(self, prefix: str, sizes: list[int]) -> dict[str, list[bytes]]:
        """Streams `<prefix>000`.. with `sizes[k]` records each; their bodies."""
        b = self.client.basin(self.basin)
        out: dict[str, list[bytes]] = {}
        for k, n in enumerate(sizes):
            name = f"{prefix}{k:03d}"
            b.create_stream(name)
            bodies = [f"{name}/{i}".encode() for i in range(n)]
            if bodies:
                b.stream(name).append_many(AppendRecord(x) for x in bodies)
            out[name] = bodies
        return out

    def append(self, stream: str, body: bytes) -> None:
        self.client.basin(self.basin).stream(stream).append([AppendRecord(body)])


@pytest.fixture(scope="module")
def envs() -> Iterator[dict[str, Env]]:
    """The module's Envs, one a server (s2-lite's; the local server's for the tests marked
    `local_server`, which count its requests), each made when a test first needs it."""
    made: dict[str, Env] = {}
    yield made
    for e in made.values():
        e.client.close()


@pytest.fixture
def env(s2_server: Any, envs: dict[str, Env]) -> Env:
    """The module's Env on the test's server."""
    if s2_server.url not in envs:
        envs[s2_server.url] = Env(s2_server.url)
    return envs[s2_server.url]


def _reader_options(env: Env, **extra: str) -> Any:
    return parse_read_options(env.options(**extra), streaming=True, fmt=S2_READ_FORMAT)


@pytest.mark.parametrize("window", [256, 3])
def test_a_packed_partition_reads_each_range_exactly_in_planned_order(
    env: Env, monkeypatch: pytest.MonkeyPatch, window: int,
) -> None:
    """Ranges of many streams in one task, small ones read ahead concurrently (in one
    window, or in windows of 3, several read at once), a long one (more than one unary
    read) in the middle, a range cut inside a stream: the rows are exactly those ranges,
    stream after stream, each in seq_num order."""
    monkeypatch.setattr(s2_backend, "WINDOW_RANGES", window)
    sizes = [3, 40, 1, 2500, 7, 0, 12] + [5] * 40
    prefix = f"pack{window}-"
    data = env.fill(prefix, sizes)
    backend = S2Backend(S2Settings(env.basin, endpoint=env.url, compression="zstd"))
    cut = f"{prefix}001"
    ranges = tuple(
        RangePartition(name, 1 if name == cut else 0, 30 if name == cut else len(bodies))
        for name, bodies in sorted(data.items()) if bodies
    )
    rows = [row for batch in read_partition(backend, _reader_options(env, streamPrefix=prefix),
                                            PackedPartition(ranges))
            for row in zip(batch.column("stream").to_pylist(),
                           batch.column("seq_num").to_pylist(),
                           batch.column("body").to_pylist(), strict=True)]
    expected = [(r.stream, i, data[r.stream][i]) for r in ranges for i in range(r.start, r.end)]
    assert rows == expected


def test_a_batch_read_of_many_streams_packs_them_into_few_tasks(env: Env, spark: Any) -> None:
    data = env.fill("few-", [4] * 120)
    reader = S2DataSource(env.options(streamPrefix="few-", maxStreamsPerPartition="50")).reader(
        None)  # type: ignore[arg-type]
    parts = list(reader.partitions())
    assert [len(p.ranges) for p in parts] == [50, 50, 20]  # type: ignore[attr-defined]
    df = spark.read.format("s2").options(**env.options(streamPrefix="few-",
                                                      maxStreamsPerPartition="50")).load()
    assert df.rdd.getNumPartitions() == 3
    got = sorted((r.stream, r.seq_num, r.body) for r in df.collect())
    assert got == [(s, i, b) for s, bodies in sorted(data.items()) for i, b in enumerate(bodies)]


@pytest.mark.local_server  # counts the local server's requests
def test_idle_plans_wait_on_the_watch_and_see_an_append_to_any_stream(
    env: Env, s2_server: Any
) -> None:
    """Over 60 idle streams (more than one pool of connections once held), plans after the
    first ask the service nothing about quiet streams; an append to one of them is
    planned, exactly, by the next plan that sees it, up to the tail the watch's answer
    gave."""
    env.fill("idle-", [2] * 60)
    reader = S2DataSource(env.options(streamPrefix="idle-")).streamReader(
        None)  # type: ignore[arg-type]
    try:
        start = reader.initialOffset()
        end = plan_all_available(reader, start)
        assert end == {f"idle-{k:03d}": 2 for k in range(60)}
        watch = reader._watch
        deadline = time.monotonic() + 30
        while watch.quiet(end) != set(end):
            assert time.monotonic() < deadline, "the watch never settled"
            time.sleep(0.05)
        before = s2_server.request_counts()
        assert plan_all_available(reader, end) == end  # nothing new, and no stream asked
        asked = s2_server.request_counts()
        assert asked.get("check_tail", 0) == before.get("check_tail", 0)
        assert asked.get("read", 0) == before.get("read", 0)  # the watch polls: read_wait
        appender = threading.Timer(0.3, env.append, ("idle-041", b"late"))
        appender.start()
        latest = end
        deadline = time.monotonic() + 30
        while latest == end:
            assert time.monotonic() < deadline, "the append never showed"
            latest = plan_all_available(reader, end)
        appender.join()
        assert latest == {**end, "idle-041": 3}
        # The long-poll's answer carried the tail: the plan did not ask for it.
        assert s2_server.request_counts().get("check_tail", 0) == before.get("check_tail", 0)
        assert list(reader.partitions(end, latest)) == [RangePartition("idle-041", 2, 3)]
    finally:
        reader.stop()


@pytest.mark.local_server  # counts the local server's requests
def test_idle_plans_ask_nothing_of_empty_streams_and_see_their_first_record(
    env: Env, s2_server: Any
) -> None:
    """Empty streams have no place in offsets until they hold records, yet the watch
    waits on them too: idle plans look none of them up, and the first record appended to
    one is planned from the stream's start."""
    env.fill("empty-", [2, 2, 0, 0, 0])
    empties = {"empty-002": 0, "empty-003": 0, "empty-004": 0}
    reader = S2DataSource(env.options(streamPrefix="empty-")).streamReader(
        None)  # type: ignore[arg-type]
    try:
        end = plan_all_available(reader, reader.initialOffset())
        assert end == {"empty-000": 2, "empty-001": 2}
        watch = reader._watch
        deadline = time.monotonic() + 30
        while watch.quiet({**end, **empties}) != {*end, *empties}:
            assert time.monotonic() < deadline, "the watch never settled"
            time.sleep(0.05)
        before = s2_server.request_counts()
        assert plan_all_available(reader, end) == end
        assert plan_all_available(reader, end) == end
        assert s2_server.request_counts().get("check_tail", 0) == before.get("check_tail", 0)
        env.append("empty-003", b"first")
        latest = end
        deadline = time.monotonic() + 30
        while latest == end:
            assert time.monotonic() < deadline, "the append never showed"
            latest = plan_all_available(reader, end)
        assert latest == {**end, "empty-003": 1}
        assert list(reader.partitions(end, latest)) == [
            RangePartition("empty-003", 0, 1, from_origin=True)]
    finally:
        reader.stop()


def test_a_plan_that_finds_nothing_new_lists_again_though_a_listing_ended_meanwhile(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan over a prefix takes the last listing and, when it is older than
    discoveryIntervalMs, has the next one made in the background. If that one ends before
    the plan does, the plan still planned from the old one: finding nothing new, it lists
    again, so a stream created a moment ago is planned (`processAllAvailable()` returned
    without it under load: a background listing that ended mid-plan was taken for one the
    plan had used)."""
    import s2_spark.spark._discovery as discovery

    started: list[bool] = []

    class AtOnce:  # the background listing, ended before the plan goes on
        def __init__(self, target: Any, **_: Any) -> None:
            self._target = target

        def start(self) -> None:
            started.append(True)
            self._target()

    env.fill("mid-", [2])
    reader = S2DataSource(env.options(streamPrefix="mid-", discoveryIntervalMs="1")
                          ).streamReader(None)  # type: ignore[arg-type]
    try:
        end = plan_all_available(reader, reader.initialOffset())
        assert end == {"mid-000": 2}
        env.client.basin(env.basin).create_stream("mid-001")
        env.append("mid-001", b"new")
        listed = reader._discovery()
        while time.monotonic() - listed._last[0] < listed._gap:  # the listing is due
            time.sleep(0.01)
        monkeypatch.setattr(discovery, "threading", SimpleNamespace(Thread=AtOnce))
        assert plan_all_available(reader, end) == {"mid-000": 2, "mid-001": 1}
        assert started == [True]  # the background listing did end mid-plan
    finally:
        reader.stop()


@pytest.mark.local_server  # counts the local server's requests
def test_streams_the_watch_cannot_hold_are_looked_up_in_turn(
    env: Env, s2_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the process may keep fewer connections than there are streams, the watch holds
    what it can and an idle plan looks up a bounded share of the rest, in turn: every
    stream is still looked up within a few plans, and an append to one is planned."""
    import s2_spark.spark.stream_reader as reader_module

    monkeypatch.setattr(reader_module, "UNWATCHED_PER_PLAN", 20)
    env.fill("over-", [1] * 60)
    reader = S2DataSource(env.options(streamPrefix="over-")).streamReader(
        None)  # type: ignore[arg-type]
    backend = reader._backend
    monkeypatch.setattr(backend, "tail_watch",
                        lambda: backend._basin().watch_tails(limit=10))
    try:
        start = reader.initialOffset()
        end = plan_all_available(reader, start)
        assert len(reader._unwatched) == 50
        held = set(end) - set(reader._unwatched)
        deadline = time.monotonic() + 30
        while reader._watch.quiet(end) != held:
            assert time.monotonic() < deadline, "the watch never settled"
            time.sleep(0.05)
        asked: set[str] = set()
        for _ in range(3):  # 50 streams, 20 a plan
            before = s2_server.request_counts().get("check_tail", 0)
            looked_up = set(reader._unwatched[:20])
            assert plan_all_available(reader, end) == end
            assert s2_server.request_counts()["check_tail"] - before == 20
            asked |= looked_up
        assert asked == set(end) - held
        late = reader._unwatched[0]  # the next plan looks it up
        env.append(late, b"late")
        assert plan_all_available(reader, end) == {**end, late: 2}
    finally:
        reader.stop()


def replay_query(spark: Any, url: str, basin: str, ckpt: str, out: str) -> Any:
    """The replay test's paced query over streams `rp-*`, started: each micro-batch's
    (partition, stream, seq_num) rows go to `out/<batch id>.json`."""
    from pyspark.sql.functions import spark_partition_id

    df = (spark.readStream.format("s2").option("endpoint", url).option("basin", basin)
          .option("streamPrefix", "rp-").option("maxRecordsPerTrigger", "400")
          .option("maxStreamsPerPartition", "7").load())

    def dump(batch: Any, batch_id: int) -> None:
        rows = batch.select(spark_partition_id().alias("p"), "stream", "seq_num").collect()
        Path(out, f"{batch_id}.json").write_text(
            json.dumps([[r.p, r.stream, r.seq_num] for r in rows]))

    return (df.writeStream.foreachBatch(dump).option("checkpointLocation", ckpt)
            .trigger(availableNow=True).start())


REPLAY_CHILD = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    tests, url, basin, ckpt, out, cores = sys.argv[1:7]
    sys.path.insert(0, tests)
    from pyspark.sql import SparkSession
    from test_spark_many_streams import replay_query
    spark = (SparkSession.builder.master(f"local[{cores}]")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    replay_query(spark, url, basin, ckpt, out).awaitTermination()
""")


@needs_admission_control
def test_packed_micro_batches_replay_identically_on_another_cluster_size(
    env: Env, spark: Any, tmp_path: Path
) -> None:
    """Run a paced query over 40 streams in the session (local[2]); forget its last
    micro-batch's commit; restart it in a process of its own on local[3]: the replayed
    batch has the same rows in the same partitions."""
    data = env.fill("rp-", [13 + (k * 7) % 31 for k in range(40)])
    script = tmp_path / "child.py"
    script.write_text(REPLAY_CHILD)
    ckpt, first, second = tmp_path / "ckpt", tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()

    q = replay_query(spark, env.url, env.basin, str(ckpt), str(first))
    assert q.awaitTermination(300), "the first run did not finish"
    assert q.exception() is None, str(q.exception())
    batches = sorted(int(p.stem) for p in first.glob("*.json"))
    total = sum(len(v) for v in data.values())
    assert len(batches) == -(-total // 400)
    seen = [tuple(r[1:]) for b in batches for r in json.loads((first / f"{b}.json").read_text())]
    assert sorted(seen) == sorted((s, i) for s, v in data.items() for i in range(len(v)))
    last = batches[-1]
    for name in (str(last), f".{last}.crc"):
        (ckpt / "commits" / name).unlink(missing_ok=True)
    done = subprocess.run([sys.executable, str(script), str(Path(__file__).parent), env.url,
                           env.basin, str(ckpt), str(second), "3"],
                          timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [p.name for p in second.glob("*.json")] == [f"{last}.json"]
    before = json.loads((first / f"{last}.json").read_text())
    after = json.loads((second / f"{last}.json").read_text())
    assert after == before
    assert len({p for p, _, _ in after}) > 1  # the batch was packed into several tasks


@pytest.mark.parametrize("option", ["maxStreamsPerPartition", "discoveryIntervalMs"])
def test_packing_and_discovery_options_take_positive_integers(env: Env, option: str) -> None:
    from s2_spark.errors import OptionError

    with pytest.raises(OptionError, match=f"option {option}='0' is not accepted: use a positive"):
        _reader_options(env, stream="x", **{option: "0"})


def test_a_plan_that_finds_nothing_new_lists_the_prefix_again(env: Env) -> None:
    """However long discoveryIntervalMs, a plan does not report "nothing new" without a
    fresh listing: a stream created a moment ago is planned from its beginning."""
    env.fill("late-", [2])
    reader = S2DataSource(env.options(streamPrefix="late-", discoveryIntervalMs="600000")
                          ).streamReader(None)  # type: ignore[arg-type]
    try:
        end = plan_all_available(reader, reader.initialOffset())
        assert end == {"late-000": 2}
        env.client.basin(env.basin).create_stream("late-new")
        env.append("late-new", b"first")
        latest = plan_all_available(reader, end)
        assert latest == {"late-000": 2, "late-new": 1}
        assert list(reader.partitions(end, latest)) == [RangePartition("late-new", 0, 1, True)]
    finally:
        reader.stop()


@pytest.mark.local_server  # counts the local server's requests
def test_an_idle_plan_leaves_a_long_listing_to_the_background(
    env: Env, s2_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the prefix holds more than QUICK_LISTING streams (tens of thousands take as
    many pages), a plan that finds nothing new does not list it again itself: the listing
    keeps to its cadence (here ten minutes, so the new stream waits); a short one does."""
    import s2_spark.spark._discovery as discovery

    env.fill("slow-", [2])
    reader = S2DataSource(env.options(streamPrefix="slow-", discoveryIntervalMs="600000")
                          ).streamReader(None)  # type: ignore[arg-type]
    try:
        end = plan_all_available(reader, reader.initialOffset())
        env.client.basin(env.basin).create_stream("slow-new")
        env.append("slow-new", b"first")
        monkeypatch.setattr(discovery, "QUICK_LISTING", 0)  # every listing is long
        before = s2_server.request_counts().get("list_streams", 0)
        assert plan_all_available(reader, end) == end
        assert s2_server.request_counts().get("list_streams", 0) == before
        monkeypatch.setattr(discovery, "QUICK_LISTING", 1)
        assert plan_all_available(reader, end) == {**end, "slow-new": 1}
    finally:
        reader.stop()


def test_a_query_over_more_streams_than_plain_offsets_hold_restarts_exactly(
    env: Env, spark: Any, tmp_path: Path
) -> None:
    """Over more than COMPACT_ABOVE streams the checkpoint's offsets are compact; a query
    restarted from it replays its uncommitted micro-batch exactly (though records were
    appended since) and then reads exactly the new records; lag_of reads the compact
    offsets of its progress."""
    import pyarrow as pa

    from s2_spark import lag_of
    from s2_spark._offset_codec import COMPACT_ABOVE, decode_offset, is_compact
    from s2_spark.s2 import SingleAppend
    from s2_spark.wire.appends import encode_append_batches

    n = COMPACT_ABOVE + 24
    names = [f"cmp-{k:05d}" for k in range(n)]
    basin = env.client.basin(env.basin)
    basin.create_streams(names)
    sizes = {name: 1 + k % 3 for k, name in enumerate(names)}
    acks = basin.append_each([SingleAppend(name, encode_append_batches(
        pa.array([f"{name}/{i}".encode() for i in range(sizes[name])], pa.binary()))[0])
        for name in names])
    assert [a.end.seq_num for a in acks] == list(sizes.values())  # type: ignore[union-attr]
    ckpt = tmp_path / "ckpt"
    batches: dict[int, list[tuple[str, int, bytes]]] = {}

    def collect(df: Any, batch_id: int) -> None:
        batches[batch_id] = sorted(tuple(r) for r in df.select(  # type: ignore[misc]
            "stream", "seq_num", "body").collect())

    def run() -> Any:
        query = (spark.readStream.format("s2").options(**env.options(streamPrefix="cmp-"))
                 .load().writeStream.foreachBatch(collect).trigger(availableNow=True)
                 .option("checkpointLocation", str(ckpt)).start())
        query.awaitTermination(300)
        assert query.exception() is None, str(query.exception())
        return query

    first = [(s, i, f"{s}/{i}".encode()) for s in names for i in range(sizes[s])]
    query = run()
    assert batches == {0: first}
    stored = json.loads((ckpt / "offsets" / "0").read_text().splitlines()[-1])
    assert is_compact(stored) and stored["streams"] == n
    assert decode_offset(stored) == sizes
    lag = lag_of(query.lastProgress)
    assert lag is not None and [len(s.streams) for s in lag.sources] == [n]
    if lag.sources[0].total is not None:  # PySpark 4.2+ reports the tails planned
        assert lag.total == 0
    late = names[3], names[500], names[-1]
    for name in late:
        env.append(name, b"late")
    for name in ("0", ".0.crc"):
        (ckpt / "commits" / name).unlink(missing_ok=True)
    batches.clear()
    run()
    replayed_then_late = {0: first, 1: sorted((s, sizes[s], b"late") for s in late)}
    if not HAS_ADMISSION_CONTROL:
        # PySpark 4.0/4.1 run AvailableNow for a source without admission control through
        # Spark's wrapper, which after replaying the uncommitted micro-batch ends the run;
        # the next run reads what came since, exactly.
        assert batches == {0: first}
        batches.clear()
        run()
        del replayed_then_late[0]
    assert batches == replayed_then_late


#: An idle query in a process that may open `limit` files (soft and hard: the watch cannot
#: raise it) over more streams than that, each holding one record. Prints the rows read
#: first, the tail lookups the server took over five idle triggers once the query
#: settled, then the rows of the micro-batch that holds a record appended to one stream.
IDLE_OVER_FD_CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    url, basin, stream, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from s2_spark.s2 import AppendRecord, S2Client, S2Config
    from s2_spark.testing.serving.server import fetch_request_counts
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.streaming.noDataProgressEventInterval", "0").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.readStream.format("s2").option("endpoint", url).option("basin", basin)
          .option("streamPrefix", "fd-").load())
    rows = []
    q = (df.writeStream.trigger(processingTime="200 milliseconds")
         .foreachBatch(lambda b, _: rows.extend(b.select("stream", "seq_num").collect()))
         .start())

    def triggers(n):
        deadline = time.monotonic() + 120
        seen = []
        while len(seen) < n:
            assert time.monotonic() < deadline, "the query stopped triggering"
            p = q.lastProgress
            if p is not None and (not seen or seen[-1] != p["timestamp"]):
                seen.append(p["timestamp"])
            time.sleep(0.05)

    triggers(5)
    before = fetch_request_counts(url).get("check_tail", 0)
    triggers(5)
    idle_lookups = fetch_request_counts(url).get("check_tail", 0) - before
    first, rows[:] = len(rows), []
    with S2Client(S2Config(endpoint=url)) as c:
        c.basin(basin).stream(stream).append([AppendRecord(b"news")])
    deadline = time.monotonic() + 60
    while not rows:
        assert time.monotonic() < deadline, "the record never showed"
        time.sleep(0.05)
    q.stop()
    print(json.dumps({"first": first, "idle_lookups": idle_lookups,
                      "rows": [[r.stream, r.seq_num] for r in rows]}))
""")


@pytest.mark.local_server  # idle lookups are counted by the local server
def test_an_idle_query_over_more_streams_than_open_files_sees_any_append(
    env: Env, tmp_path: Path
) -> None:
    """Over HTTP/2 the watch holds every stream whatever the open-files limit: idle plans
    look nothing up (over HTTP/1.1, 1,024 of these streams would be left to lookups in
    turn), and a record appended to any stream is planned."""
    import pyarrow as pa

    from s2_spark.s2 import SingleAppend
    from s2_spark.wire.appends import encode_append_batches

    limit, n = 2048, 2600
    names = [f"fd-{k:05d}" for k in range(n)]
    basin = env.client.basin(env.basin)
    basin.create_streams(names)
    # Streams with a record: an empty one is not in the offsets, and is looked up by
    # every plan as a new stream, watch or not. Sent together (`append_each`).
    record = encode_append_batches(pa.array([b"x"], pa.binary()))[0]
    acks = basin.append_each([SingleAppend(name, record) for name in names])
    assert [a.end.seq_num for a in acks] == [1] * n  # type: ignore[union-attr]
    script = tmp_path / "child.py"
    script.write_text(IDLE_OVER_FD_CHILD)
    target = names[1777]
    done = subprocess.run([sys.executable, str(script), env.url, env.basin, target,
                           str(limit)], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"first": n, "idle_lookups": 0, "rows": [[target, 1]]}
