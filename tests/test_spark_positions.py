"""startingPosition / endingPosition per stream, seq_nums and times mixed, end to end.

Real queries on local[2] against the local S2 server (whose streams keep client timestamps
as given, `client-prefer`), real checkpoints. Records carry explicit timestamps, with
repeats and gaps, so "the first record at or after a time" is exact: each test asserts
the rows read and the offsets a streaming query records.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _s2_target import s2_config, token
from _versions import progress_offsets

from s2_spark.backends.s2.backend import S2Backend
from s2_spark.s2 import AppendRecord, S2Client
from s2_spark.spark._planner import Planner
from s2_spark.spark.datasource import stream_reader
from s2_spark.spark.options import parse_read_options
from s2_spark.spark.s2.source import S2_READ_FORMAT

pytestmark = pytest.mark.spark

SECRET = token("tok-POS-SECRET-2b8e")
T0 = (int(time.time()) - 3600) * 1000  # an hour ago: client timestamps kept exactly
#: After every record any test here appends.
PAST_EVERY_RECORD = T0 + 1_000_000

#: Each stream's record timestamps, as offsets from T0 (seq_num = index).
TIMES = {
    "a": [0, 10, 10, 20, 30, 30, 40],
    "b": [5, 15, 25, 35, 45],
    "c": [1, 2, 3, 4],
}

Row = tuple[str, int, int, bytes]  # stream, seq_num, timestamp millis, body


class Env:
    """The shared server, a basin, and helpers to fill streams and read them with Spark."""

    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = S2Client(s2_config(url))
        self.basin = f"spark-pos-{uuid.uuid4().hex[:10]}"
        self.client.create_basin(self.basin)
        self.tmp = Path(tempfile.mkdtemp(prefix="s2-spark-positions-"))

    def fill(self, prefix: str, times: dict[str, list[int]]) -> dict[str, list[Row]]:
        """Create `prefix + name` for each stream and append records at T0 + each time;
        returns every stream's rows, keyed by the short name."""
        out: dict[str, list[Row]] = {}
        for name, offsets in times.items():
            self.client.basin(self.basin).create_stream(prefix + name)
            out[name] = self.append(prefix + name, offsets)
        return out

    def append(self, stream: str, offsets: list[int]) -> list[Row]:
        s = self.client.basin(self.basin).stream(stream)
        first = s.check_tail().seq_num
        ack = s.append_many([AppendRecord(f"{stream}:{first + i}".encode(), timestamp=T0 + t)
                             for i, t in enumerate(offsets)])
        assert ack.start.seq_num == first
        return [(stream, first + i, T0 + t, f"{stream}:{first + i}".encode())
                for i, t in enumerate(offsets)]

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url, "basin": self.basin, "accessToken": SECRET, **extra}

    def read(self, **opts: str) -> Any:
        return self.spark.read.format("s2").options(**self.options(**opts)).load()

    def read_stream(self, **opts: str) -> Any:
        return self.spark.readStream.format("s2").options(**self.options(**opts)).load()

    def checkpoint(self) -> str:
        return str(self.tmp / f"ckpt-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def env(target_s2: Any, spark: Any) -> Iterator[Env]:
    e = Env(target_s2.url, spark)
    yield e
    e.client.close()
    shutil.rmtree(e.tmp, ignore_errors=True)


def rows_of(df: Any) -> list[Row]:
    got = df.selectExpr("stream", "seq_num", "unix_millis(timestamp) AS ts", "body").collect()
    return sorted((r["stream"], r["seq_num"], r["ts"], bytes(r["body"])) for r in got)


def at(ms: int) -> dict[str, int]:
    return {"timestamp": T0 + ms}


def position(prefix: str, **streams: object) -> str:
    """A JSON position naming `prefix + name` for each keyword."""
    return json.dumps({prefix + name: pos for name, pos in streams.items()})


def run_available_now(df: Any, checkpoint: str) -> list[tuple[list[Row], Any]]:
    """Run to the tails with a checkpoint; each micro-batch's rows and end offset (Spark
    reports no start offset for a query's first batch: see `initial_offset`)."""
    batches: dict[int, list[Row]] = {}
    q = (
        df.writeStream.foreachBatch(lambda d, i: batches.__setitem__(i, rows_of(d)))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(120), "the query did not finish"
    except Exception as exc:  # StreamingQueryException: the query failed
        raise AssertionError(str(exc)) from None
    ends = {p["batchId"]: progress_offsets(p["sources"][0]["endOffset"])
            for p in q.recentProgress if p["numInputRows"] > 0}
    assert sorted(ends) == sorted(batches)
    return [(batches[i], ends[i]) for i in sorted(batches)]


def initial_offset(env: Env, **opts: str) -> dict[str, Any]:
    """The offset a new streaming query with these options starts from, as its reader
    resolves it on the driver."""
    options = parse_read_options(env.options(**opts), streaming=True, fmt=S2_READ_FORMAT)
    return stream_reader(S2Backend(options.connection), options).initialOffset()


# -- per-stream times, mixed with seq_nums ------------------------------------------------


def test_batch_starts_and_ends_per_stream(env: Env) -> None:
    p = f"mix-{uuid.uuid4().hex[:6]}-"
    rows = env.fill(p, TIMES)
    a, b, c = rows["a"], rows["b"], rows["c"]
    streams = ",".join(p + s for s in TIMES)
    # a: first record at or after T0+10 is seq_num 1 (two share that time); b: T0+26 falls
    # between records, the next is seq_num 3; c: a seq_num.
    start = position(p, a=at(10), b=at(26), c=2)
    assert rows_of(env.read(streams=streams, startingPosition=start)) == a[1:] + b[3:] + c[2:]
    # Exclusive ends: a stops before its first record at T0+30 (seq_num 4), b at
    # seq_num 4, c before T0+4 (seq_num 3).
    end = position(p, a=at(30), b=4, c=at(4))
    assert rows_of(env.read(streams=streams, startingPosition=start, endingPosition=end)) \
        == a[1:4] + b[3:4] + c[2:3]
    # Streams left out start at earliest and end at latest; a time before every record
    # is the first record.
    assert rows_of(env.read(streams=streams, startingPosition=position(p, b=at(-5)),
                            endingPosition=position(p, a=at(20)))) == a[:3] + b + c
    # An end time at a start time's record reads nothing of that stream.
    assert rows_of(env.read(streams=streams, startingPosition=position(p, a=at(30)),
                            endingPosition=position(p, a=at(30), b=1, c=0))) == b[:1]


def test_stream_starts_per_stream_and_checkpoint_wins(env: Env) -> None:
    p = f"smix-{uuid.uuid4().hex[:6]}-"
    rows = env.fill(p, TIMES)
    a, b, c = rows["a"], rows["b"], rows["c"]
    streams = ",".join(p + s for s in TIMES)
    ckpt = env.checkpoint()
    start = position(p, a=at(20), b=at(15), c=3)
    assert initial_offset(env, streams=streams, startingPosition=start) \
        == {p + "a": 3, p + "b": 1, p + "c": 3}
    batches = run_available_now(env.read_stream(streams=streams, startingPosition=start), ckpt)
    assert batches == [(a[3:] + b[1:] + c[3:], {p + "a": 7, p + "b": 5, p + "c": 4})]
    # A restart takes its start from the checkpoint, whatever startingPosition says now:
    # only the records appended since, at any time.
    a2 = env.append(p + "a", [41, 50])
    c2 = env.append(p + "c", [60])
    batches = run_available_now(
        env.read_stream(streams=streams, startingPosition=position(p, a=at(0), c=0)), ckpt)
    assert batches == [(a2 + c2, {p + "a": 9, p + "b": 5, p + "c": 5})]


# -- a time after every record ------------------------------------------------------------


def test_time_past_the_tail_batch(env: Env) -> None:
    p = f"past-{uuid.uuid4().hex[:6]}-"
    rows = env.fill(p, TIMES)
    a, b, c = rows["a"], rows["b"], rows["c"]
    streams = ",".join(p + s for s in TIMES)
    past = {"timestamp": PAST_EVERY_RECORD}
    # Start: at the tail, so nothing of a. End: at the tail, so all of b.
    assert rows_of(env.read(streams=streams, startingPosition=position(p, a=past),
                            endingPosition=position(p, b=past, c=1))) == b + c[:1]
    # The same for all streams at once (timestamp:<ms>).
    assert rows_of(env.read(streams=streams,
                            startingPosition=f"timestamp:{PAST_EVERY_RECORD}")) == []
    assert rows_of(env.read(streams=streams, startingPosition=position(p, a=at(40)),
                            endingPosition=f"timestamp:{PAST_EVERY_RECORD}")) \
        == a[6:] + b + c


def test_time_past_the_tail_stream_reads_records_appended_later(env: Env) -> None:
    p = f"spast-{uuid.uuid4().hex[:6]}-"
    rows = env.fill(p, {"a": TIMES["a"], "b": TIMES["b"]})
    streams = f"{p}a,{p}b"
    ckpt = env.checkpoint()
    start = position(p, a={"timestamp": PAST_EVERY_RECORD}, b=4)
    assert initial_offset(env, streams=streams, startingPosition=start) \
        == {p + "a": 7, p + "b": 4}
    df = env.read_stream(streams=streams, startingPosition=start)
    assert run_available_now(df, ckpt) == [(rows["b"][4:], {p + "a": 7, p + "b": 5})]
    # Records appended after the start are read, though their times lie before the
    # starting time: the time became a position (the tail) once, when the query began.
    later = env.append(p + "a", [41, 42])
    assert run_available_now(df, ckpt) == [(later, {p + "a": 9, p + "b": 5})]


def test_end_time_past_the_tail_ends_at_the_tail_the_plan_saw(env: Env) -> None:
    """Records appended between the plan's tail lookup and the time lookup lie past that
    tail: the end is that tail (before, such an end failed as past the tail)."""
    p = f"race-{uuid.uuid4().hex[:6]}-"
    env.fill(p, {"a": TIMES["a"]})
    options = parse_read_options(
        env.options(stream=p + "a", endingPosition=position(p, a=at(1000))),
        streaming=False, fmt=S2_READ_FORMAT)
    backend = S2Backend(options.connection)
    planner = Planner(backend, options)
    assert options.ending is not None
    tail = planner.tail(p + "a")
    env.append(p + "a", [100, 2000])  # seq_nums 7 (before the end time) and 8
    assert (tail, backend.latest(p + "a")) == (7, 9)
    assert planner.resolve(options.ending, p + "a", default="latest", tail=tail) == 7
    assert planner.resolve(options.ending, p + "a", default="latest") == 8


# -- bad positions --------------------------------------------------------------------------

#: What a bad position's message says is accepted, after the option's kinds.
S2_ACCEPTED = (
    ", 'timestamp:<epoch millis>' or a JSON object of stream to position such as "
    '{"events": 42} (the next seq_num to read), or to a time {"timestamp": <epoch millis>}'
)
KINDS = {"startingPosition": "use 'earliest', 'latest'", "endingPosition": "use 'latest'"}
BAD_POSITIONS: list[tuple[str, str, str]] = [
    ("startingPosition", '{"s": {"timestamp": -1}}',
     "the timestamp must be epoch milliseconds, an integer >= 0 (got -1)"),
    ("startingPosition", '{"s": {"timestamp": "x"}}',
     'the timestamp must be epoch milliseconds, an integer >= 0 (got "x")'),
    ("startingPosition", '{"s": {"timestamp": 1.5}}',
     "the timestamp must be epoch milliseconds, an integer >= 0 (got 1.5)"),
    ("endingPosition", '{"s": {"timestamp": true}}',
     "the timestamp must be epoch milliseconds, an integer >= 0 (got true)"),
    ("endingPosition", '{"s": {"timestamp": 18446744073709551616}}',
     "the timestamp must be epoch milliseconds, an integer >= 0 (got 18446744073709551616)"),
    ("startingPosition", '{"s": {"ts": 1}}',
     'an object position is a time, written {"timestamp": <epoch millis>} (got {"ts": 1})'),
    ("endingPosition", '{"s": {}}',
     'an object position is a time, written {"timestamp": <epoch millis>} (got {})'),
    ("startingPosition", '{"s": {"timestamp": 1, "x": 2, "seq_num": 3}}',
     'a time is written {"timestamp": <epoch millis>} with no other key (got '
     '{"timestamp": 1, "x": 2, "seq_num": 3}, extra key(s) [\'seq_num\', \'x\'])'),
    ("startingPosition", '{"s": [1]}', "a seq_num must be an integer >= 0 (got [1])"),
]


@pytest.mark.parametrize(("option", "value", "why"), BAD_POSITIONS,
                         ids=[v for _, v, _ in BAD_POSITIONS])
def test_bad_position_fails_at_load(env: Env, option: str, value: str, why: str) -> None:
    reader = env.spark.read.format("s2").options(**env.options(stream="s", **{option: value}))
    with pytest.raises(Exception, match="OptionError") as info:
        reader.load()
    expected = (f"option {option}: the position of stream 's' is not accepted ({why}); "
                f"{KINDS[option]}{S2_ACCEPTED}")
    assert expected in str(info.value)
    assert SECRET not in str(info.value)


def test_streaming_bad_position_fails_at_load(env: Env) -> None:
    reader = env.spark.readStream.format("s2").options(
        **env.options(streams="s,t", startingPosition='{"s": 1, "t": {"timestamp": -5}}'))
    with pytest.raises(Exception, match="OptionError") as info:
        reader.load()
    assert ("option startingPosition: the position of stream 't' is not accepted (the "
            "timestamp must be epoch milliseconds, an integer >= 0 (got -5))") in str(info.value)


def test_durable_streams_has_no_times(ds_server: Any, spark: Any) -> None:
    from s2_spark.durable import DurableStreamsClient

    path = f"/positions/{uuid.uuid4().hex[:12]}"
    client = DurableStreamsClient(base_url=ds_server.url)
    try:
        client.stream(path).create("application/json")
    finally:
        client.close()
    accepted = (
        ' or a JSON object of stream to position such as '
        '{"/events": "0000000000000000_0000000000000512"} (an offset the server gave in '
        'Stream-Next-Offset, or "-1")'
    )
    for option in ("startingPosition", "endingPosition"):
        value = json.dumps({path: {"timestamp": T0}})
        reader = spark.read.format("durable-streams").options(
            baseUrl=ds_server.url, stream=path, **{option: value})
        with pytest.raises(Exception, match="OptionError") as info:
            reader.load()
        assert (
            f"option {option}: the position of stream {path!r} is not accepted (this "
            "format's records carry no timestamps, so a stream cannot start or end at a "
            f'time (got {{"timestamp": {T0}}})); {KINDS[option]}{accepted}'
        ) in str(info.value)
