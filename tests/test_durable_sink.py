"""The exactly-once Durable Streams sink (s2_spark.backends.durable.sink), without Spark.

Real appends against the Durable Streams reference server: requests cut from the rows,
JSON and byte streams, a retried attempt answered as duplicates, a zombie of an older
micro-batch and a foreign producer fenced out, rows routed to many streams, targets
checked, streams closed or deleted under a writer, bad rows named, and the shared write
path (`backends.sink`): a task attempt's producer, a partition sink opened from a plan,
closeStreamOnFinish.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from s2_spark.backends.durable.options import DurableSettings
from s2_spark.backends.durable.sink import (
    DurableInputLayout,
    DurableSinkPlan,
    PartitionWriter,
    check_target,
    producer_identity,
)
from s2_spark.backends.durable.stream_sink import (
    Payload,
    ProducerIdentity,
    SinkSettings,
    StreamSink,
    StreamTarget,
    TargetError,
)
from s2_spark.backends.sink import TaskAttempt, WriteJob, describe_results, write_partition
from s2_spark.durable import DurableStreamsClient, IdempotentProducer
from s2_spark.errors import S2SparkError, WriterFencedError

pytestmark = pytest.mark.backend

JSON = "application/json"
BYTES = "application/octet-stream"
TEXT = Payload("value", True)


class Boom(Exception):
    pass


class Env:
    """The shared reference server and read-back helpers."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = DurableStreamsClient(base_url=url)

    def new_stream(self, prefix: str, content_type: str | None = JSON) -> str:
        """A fresh stream path (created unless content_type is None)."""
        path = f"/sink/{prefix}-{uuid.uuid4().hex[:8]}"
        if content_type is not None:
            self.client.stream(path).create(content_type)
        return path

    def settings(self) -> DurableSettings:
        return DurableSettings(base_url=self.url)

    def target(self, path: str) -> StreamTarget:
        info = self.client.stream(path).head()
        return StreamTarget(self.client.config.stream_url(path), info.content_type or BYTES)

    def messages(self, path: str) -> list[str]:
        return messages(self.client, path)

    def data(self, path: str) -> bytes:
        return data(self.client, path)


def messages(client: DurableStreamsClient, path: str) -> list[str]:
    """Every message of a JSON stream, as its JSON text, in order."""
    out: list[str] = []
    for chunk in client.stream(path).read("-1"):
        out += chunk.batch().column("value").to_pylist()
    return out


def data(client: DurableStreamsClient, path: str) -> bytes:
    """Every byte of a stream, in order."""
    return b"".join(chunk.data for chunk in client.stream(path).read("-1"))


@pytest.fixture(scope="module")
def env(ds_server: Any) -> Iterator[Env]:
    e = Env(ds_server.url)
    yield e
    e.client.close()


def jsons(n: int, start: int = 0) -> list[str]:
    return [f'{{"i":{i}}}' for i in range(start, start + n)]


def job(name: str = "sinktest", partition: int = 0, attempt: int = 0) -> ProducerIdentity:
    return ProducerIdentity.job(name, partition, attempt)


def sink(env: Env, path: str, me: ProducerIdentity, settings: SinkSettings,
         **kw: Any) -> StreamSink:
    return StreamSink(env.client, env.target(path), path, me, settings, **kw)


def values(rows: list[str]) -> pa.Array:
    return pa.array([r.encode() for r in rows], pa.binary())


# -- one stream ---------------------------------------------------------------------------


def test_json_rows_cut_into_requests_in_order(env: Env) -> None:
    out = env.new_stream("json")
    s = sink(env, out, job(), SinkSettings(max_messages=100))
    s.add(values(jsons(120)))
    s.add(values(jsons(130, 120)))
    result = s.close()
    assert (result.stream, result.rows, result.appends, result.duplicates) == (out, 250, 3, 0)
    assert (result.replayed_rows, result.replayed_appends) == (None, 0)
    assert result.url == env.client.config.stream_url(out)
    assert env.messages(out) == jsons(250)


def test_request_bytes_bound_and_a_row_larger_goes_alone(env: Env) -> None:
    """A request takes rows while it stays within max_bytes (each message counted with
    one separator); a row larger than max_bytes is sent in a request of its own."""
    out = env.new_stream("bytes-bound")
    rows = ['"aaaa"', '"bbbb"', '"cccc"', '"' + "x" * 40 + '"', '"dddd"']
    s = sink(env, out, job(), SinkSettings(max_bytes=14))
    s.add(values(rows))
    result = s.close()
    assert (result.rows, result.appends) == (5, 4)  # [a, b] [c] [x...] [d]
    assert env.messages(out) == rows


def test_byte_stream_takes_the_rows_bytes_concatenated(env: Env) -> None:
    out = env.new_stream("raw", BYTES)
    s = sink(env, out, job(), SinkSettings(max_bytes=4))
    s.add(pa.array([b"ab", b"", b"cd", b"efgh", b"i"], pa.binary()))
    result = s.close()
    assert (result.rows, result.appends) == (5, 4)  # [ab, ""] [cd] [efgh] [i]
    assert env.data(out) == b"abcdefghi"
    only_empty = sink(env, out, job("other"), SinkSettings())
    only_empty.add(pa.array([b"", b""], pa.binary()))
    assert (only_empty.close().appends, env.data(out)) == (0, b"abcdefghi")


def test_retried_attempt_is_answered_as_duplicates(env: Env) -> None:
    """Attempt 0 dies after 2 acknowledged requests; attempt 1 (same producer and epoch)
    sends the same requests: the server has the first 2 and appends the rest."""
    out = env.new_stream("retry")
    every = jsons(500)
    seen: list[int] = []

    def die(s: StreamSink) -> None:
        seen.append(s.appends)
        if s.appends == 2:
            raise Boom()

    first = sink(env, out, job(), SinkSettings(max_messages=100), after_append=die)
    with pytest.raises(Boom):
        first.add(values(every))
    first.abort()
    assert seen == [1, 2]
    assert env.messages(out) == every[:200]
    retry = sink(env, out, job(attempt=1), SinkSettings(max_messages=100))
    retry.add(values(every))
    result = retry.close()
    assert (result.rows, result.appends, result.duplicates) == (500, 5, 2)
    assert env.messages(out) == every


def test_zombie_of_an_older_micro_batch_is_fenced(env: Env) -> None:
    """Micro-batch 1 wrote with the query's producer; an attempt still running micro-batch
    0 is refused (stale epoch); a late attempt at micro-batch 1 only repeats it."""
    out = env.new_stream("zombie")
    q = f"q-{uuid.uuid4().hex[:6]}"
    b1 = sink(env, out, ProducerIdentity.streaming(q, 1, 0, 0), SinkSettings())
    b1.add(values(jsons(3)))
    b1.close()
    zombie = sink(env, out, ProducerIdentity.streaming(q, 0, 0, 0), SinkSettings())
    zombie.add(values(jsons(2, 100)))
    with pytest.raises(WriterFencedError) as info:
        zombie.close()
    assert str(info.value) == (
        f"stream '{out}': this attempt of micro-batch 0 (partition 0, attempt 0) is stale: a "
        f"newer micro-batch (1) owns producer 'spark-{q}-p0', so this zombie task stops "
        "without writing (the newer micro-batch has these rows)"
    )
    late = sink(env, out, ProducerIdentity.streaming(q, 1, 0, 1), SinkSettings())
    late.add(values(jsons(3)))
    result = late.close()
    assert (result.appends, result.duplicates) == (1, 1)
    assert env.messages(out) == jsons(3)


def test_batch_job_fenced_by_a_foreign_epoch(env: Env) -> None:
    """Another writer used the job's producer id at epoch 1: the job (epoch 0) stops."""
    out = env.new_stream("foreign")
    with IdempotentProducer(env.client.stream(out), "spark-job-taken-p0", epoch=1) as other:
        other.append_raw('"theirs"')
    s = sink(env, out, job("taken"), SinkSettings())
    s.add(values(['"ours"']))
    with pytest.raises(WriterFencedError) as info:
        s.close()
    assert str(info.value) == (
        f"stream '{out}': producer 'spark-job-taken-p0' was fenced by epoch 1, which this "
        "batch job did not write (another writer uses its producer id); this attempt stops"
    )
    assert env.messages(out) == ['"theirs"']


def test_stream_closed_or_deleted_under_the_writer(env: Env) -> None:
    def refused(s: StreamSink) -> str:
        s.add(values(jsons(1)))
        with pytest.raises(TargetError) as info:
            s.close()
        return str(info.value)

    out = env.new_stream("closed")
    env.client.stream(out).close()
    assert refused(sink(env, out, job(), SinkSettings())) == (
        f"stream '{out}' was closed while a batch job, partition 0, attempt 0 was appending "
        "to it; nothing more can be appended"
    )
    gone = env.new_stream("deleted")
    s = sink(env, gone, job(partition=4, attempt=1), SinkSettings())
    env.client.stream(gone).delete()
    assert refused(s) == (
        f"stream '{gone}' disappeared while a batch job, partition 4, attempt 1 was appending "
        "to it"
    )


# -- targets --------------------------------------------------------------------------------


def test_targets_checked_before_writing(env: Env) -> None:
    missing = env.new_stream("missing", None)
    url = env.client.config.stream_url(missing)
    with pytest.raises(TargetError) as info:
        check_target(env.settings(), url, missing, SinkSettings(), TEXT)
    assert str(info.value) == (
        f"stream '{missing}' does not exist: create it first, or set option "
        "createStreams=true (with option contentType, default application/json)"
    )
    made = check_target(env.settings(), url, missing,
                        SinkSettings(create_streams=True, content_type="text/plain"), TEXT)
    assert made == StreamTarget(url, "text/plain")
    assert env.client.stream(missing).head().content_type == "text/plain"
    closed = env.new_stream("closed-target")
    env.client.stream(closed).close()
    with pytest.raises(TargetError, match=f"stream '{closed}' is closed: nothing more can be "
                       r"appended to it \(write to another stream\)"):
        check_target(env.settings(), env.client.config.stream_url(closed), closed,
                     SinkSettings(), TEXT)
    json_stream = env.new_stream("binary-value")
    with pytest.raises(TargetError) as info:
        check_target(env.settings(), env.client.config.stream_url(json_stream), json_stream,
                     SinkSettings(), Payload("value", False))
    assert str(info.value).startswith(
        f"stream '{json_stream}' cannot take these rows: content type application/json takes "
        "one JSON message per row: column value must be a string of JSON text")


def _settings(env: Env) -> Any:
    from s2_spark.backends.durable.options import DurableSettings

    return DurableSettings(base_url=env.url)


# -- a partition's rows routed to many streams ------------------------------------------------


def test_rows_routed_to_streams_in_first_seen_order(env: Env) -> None:
    a, b, c = (env.new_stream(p) for p in ("ra", "rb", "rc"))
    rows = jsons(9)
    routes = [b, a, b, c, a, b, b, c, a]
    w = PartitionWriter(env.client, job(), SinkSettings(), TEXT)
    w.add(pa.array(rows), pa.array(routes))
    w.add(pa.array(jsons(2, 9)), pa.array([c, c]))
    results = w.close()
    assert [(r.stream, r.rows, r.appends) for r in results] == [(b, 4, 1), (a, 3, 1),
                                                                  (c, 4, 1)]
    assert env.messages(b) == [rows[0], rows[2], rows[5], rows[6]]
    assert env.messages(a) == [rows[1], rows[4], rows[8]]
    assert env.messages(c) == [rows[3], rows[7], *jsons(2, 9)]


def test_bad_rows_in_the_sink(env: Env) -> None:
    """The same checks without Spark (the task code below the Spark layer), one per row."""
    import pyarrow as pa

    from s2_spark.backends.durable.sink import (
        PartitionWriter,
        Payload,
        ProducerIdentity,
        SinkSettings,
    )
    from s2_spark.errors import S2SparkError, StreamBadRequestError

    out = env.new_stream("sink-rows")
    me = ProducerIdentity.job("sinktest", 0, 0)

    def write(values: list[str | None], routes: list[str] | None = None,
              column: str = "stream") -> None:
        with DurableStreamsClient(base_url=env.url) as client:
            w = PartitionWriter(client, me, SinkSettings(), Payload("value", True),
                                route_column=column)
            w.add(pa.array(values, pa.string()), pa.array(routes or [out] * len(values)))
            w.close()

    for value in ("   ", '{"a":[1}', "[1]]"):
        with pytest.raises(S2SparkError) as info:
            write(['{"ok":1}', value])
        assert str(info.value).startswith(
            f"row 1 of this task's rows for stream '{out}' is not one JSON value ({value!r})")
    # What the structure check lets through, the server's JSON parser rejects.
    with pytest.raises(StreamBadRequestError) as bad:
        write(["1", "{a:1}"])
    assert "Invalid JSON" in str(bad.value)
    assert bad.value.__notes__ == [
        f"while appending to stream '{out}' (a batch job, partition 0, attempt 0, producer "
        "'spark-job-sinktest-p0')"
    ]
    with pytest.raises(S2SparkError, match="row 1 of this task has a null value"):
        write(["1", None])
    with pytest.raises(S2SparkError, match="row 0 of this task has a null url column"):
        write(["1"], [None], "url")  # type: ignore[list-item]
    with pytest.raises(S2SparkError, match="column url holds 'w/x', which is not an absolute"):
        write(["1"], ["w/x"], "url")
    assert env.messages(out) == []


# -- the shared write path (backends.sink) -----------------------------------------------------


def test_task_attempts_map_to_producers() -> None:
    batch_job = WriteJob(streaming=False, job_id="j1", planned_ms=1)
    assert producer_identity(TaskAttempt(batch_job, 3, 1)) == ProducerIdentity(
        "spark-job-j1-p3", 0, 3, 1, None)
    query = WriteJob(streaming=True, job_id="unused", planned_ms=1)
    assert producer_identity(TaskAttempt(query, 2, 0, "q-7", 5)) == ProducerIdentity(
        "spark-q-7-p2", 5, 2, 0, 5)


def test_partition_sink_from_a_plan(env: Env) -> None:
    """What a Spark task does, without Spark: open the attempt's sink from the plan, write
    the input batches, close; a replayed attempt finds every request there; the job's
    end closes the streams (closeStreamOnFinish)."""
    a, b = env.new_stream("plan-a"), env.new_stream("plan-b")
    layout = DurableInputLayout(payload=1, kind=TEXT, route=0, route_column="stream",
                                names=("stream", "value", "offset"))
    plan = DurableSinkPlan(env.settings(), None, None, SinkSettings(max_messages=2), layout,
                           close_on_finish=True)
    batches = [
        pa.RecordBatch.from_pydict({"stream": [a, b, a], "value": jsons(3),
                                    "offset": [None, None, None]}),
        pa.RecordBatch.from_pydict({"stream": [a], "value": jsons(1, 3), "offset": ["x"]}),
    ]
    attempt = TaskAttempt(WriteJob.plan(streaming=False), 0, 0)

    def run(attempt: TaskAttempt) -> list[Any]:
        with plan.open(attempt, None) as sink:
            assert sink.dropped_commands == 0
            return write_partition(sink, batches)

    first = run(attempt)
    assert [(r.stream, r.rows, r.appends, r.duplicates) for r in first] == [(a, 3, 2, 0),
                                                                          (b, 1, 1, 0)]
    assert describe_results(first) == "4 rows in 3 append requests (0 of them already " \
        "written: replayed)"
    replay = run(TaskAttempt(attempt.job, 0, 1))
    assert [(r.rows, r.appends, r.duplicates) for r in replay] == [(3, 2, 2), (1, 1, 1)]
    assert (env.messages(a), env.messages(b)) == ([jsons(3)[0], jsons(3)[2], *jsons(1, 3)],
                                                  [jsons(3)[1]])
    assert plan.finish(first + replay) == "closed 2 streams (closeStreamOnFinish)"
    assert env.client.stream(a).head().closed and env.client.stream(b).head().closed


def test_failed_partition_sink_is_aborted(env: Env) -> None:
    """A bad row fails the task naming it; nothing of the batch was sent."""
    out = env.new_stream("abort")
    layout = DurableInputLayout(payload=0, kind=TEXT, route=None, route_column="stream",
                                names=("value",))
    checked = env.target(out)
    plan = DurableSinkPlan(env.settings(), out, checked, SinkSettings(), layout)
    assert plan.finish([]) is None
    batch = pa.RecordBatch.from_pydict({"value": ['{"a":1}', None]})
    with plan.open(TaskAttempt(WriteJob.plan(streaming=False), 0, 0), None) as sink, \
            pytest.raises(S2SparkError, match="row 1 of this task has a null value"):
        write_partition(sink, [batch])
    assert env.messages(out) == []
