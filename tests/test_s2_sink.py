"""The exactly-once S2 sink protocol (s2_spark.backends.s2.sink), without Spark.

Real appends against the local server: the marks and tokens the sink leaves, resuming
after a partial write, restarts (a newer run), zombies of older attempts, partitions and
attempts writing one stream at once, streams written by the previous release.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from s2_spark.backends.s2._digest import RowsDigest
from s2_spark.backends.s2.sink import (
    DATA_MAX_BYTES,
    DATA_MAX_RECORDS,
    ForeignFenceError,
    SinkSettings,
    StreamSink,
    WriterId,
    query_key,
)
from s2_spark.backends.s2.tokens import Mark, Seen, parse_mark, run_key
from s2_spark.errors import (
    FencingTokenMismatchError,
    NotFoundError,
    RecordTooLargeError,
    WriterFencedError,
)
from s2_spark.s2 import AppendRecord
from s2_spark.wire.appends import EncodedRecords, encode_entries

pytestmark = pytest.mark.backend

PER = DATA_MAX_RECORDS  # data records per append (998)


class Boom(Exception):
    pass


def data_rows(basin: Any, stream: str) -> list[tuple[bytes, list[tuple[bytes, bytes]]]]:
    """Every non-command record of `stream`, in order."""
    out: list[tuple[bytes, list[tuple[bytes, bytes]]]] = []
    for rec in all_records(basin, stream, commands=False):
        out.append((rec["body"], [(h["name"], h["value"]) for h in rec["headers"]]))
    return out


def all_records(basin: Any, stream: str, *, commands: bool = True) -> list[dict[str, Any]]:
    s = basin.stream(stream)
    tail = s.check_tail().seq_num
    out: list[dict[str, Any]] = []
    pos = 0
    while pos < tail:
        decoded = s.read(seq_num=pos, count=min(1000, tail - pos),
                         include_command_records=commands)
        if decoded.count == 0:
            break
        out += decoded.batch.to_pylist()
        pos = int(decoded.last_seq_num) + 1
    return out


def fences(basin: Any, stream: str) -> list[str]:
    """The values of the stream's fence records, in order."""
    return [r["body"].decode() for r in all_records(basin, stream)
            if r["headers"] == [{"name": b"", "value": b"fence"}]]


def marks(basin: Any, stream: str) -> list[Mark]:
    return [m for v in fences(basin, stream) if (m := parse_mark(v)) is not None]


def token(basin: Any, name: str) -> str:
    """The stream's fencing token, learnt from a fence conditioned on one it cannot have."""
    try:
        basin.stream(name).fence("never-set", fencing_token="never-set")
    except FencingTokenMismatchError as exc:
        return exc.expected_token
    raise AssertionError("the probe token matched")


def bodies(n: int, prefix: str = "r", start: int = 0) -> pa.Array:
    return pa.array([f"{prefix}{i}".encode() for i in range(start, start + n)], pa.binary())


def wid(**kw: Any) -> WriterId:
    base: dict[str, Any] = dict(
        query=query_key("q1"), streaming=True, run=run_key("run-1"), generation=1000,
        batch=3, partition=0, attempt=0,
    )
    base.update(kw)
    return WriterId(**base)


SMALL = SinkSettings(flush_records=PER)


def test_marks_and_tokens() -> None:
    """Marks round-trip, fit S2's 36 bytes at the largest values, and the previous
    release's lease tokens read as marks (its query keys are computed as it did); tokens
    mean what they should to a writer."""
    assert (query_key("q1"), query_key("19ccfb7d-0e90-4c68-a716-a7f9efbcfc07")) == ("3y9", "l9k")
    big = WriterId(query_key("q"), True, run_key("r"), 2**41, 36**5 - 1, 36**3 - 1, 99)
    m = big.mark(36**7 - 1)
    assert len(m.encode()) <= 36 and parse_mark(m.encode()) == m
    # A data mark holds as much of its rows' digest as fits: here none (a replay of it
    # reads the rows back), usually 10 characters; bump marks hold none.
    digest = RowsDigest().extend(b"rows")
    m = big.mark(36**7 - 1, digest=digest)
    assert len(m.encode()) == 36 and parse_mark(m.encode()) == m and m.digest == ""
    m = wid().mark(5000, digest=digest)
    assert parse_mark(m.encode()) == m and m.digest == digest.text()[:10]
    assert digest.matches(m.digest) and not RowsDigest().matches(m.digest)
    assert not digest.matches(m.digest[:5])  # too short to trust
    assert parse_mark(wid().mark(5, data=False, digest=digest).encode()).digest is None
    assert parse_mark(wid().mark(5).encode()).digest is None  # written before digests
    assert parse_mark(wid().mark(5).encode() + ".a-b") is None
    assert len(big.bump_token(36**2 - 1)) <= 36 and len(big.run_token()) <= 36
    assert parse_mark("wLSabc.1.2.3.4.5") == Mark(True, "abc", 1, 2, 3, 4, 5, data=True)
    assert parse_mark(big.run_token()) is None and parse_mark("someone-else") is None
    me = wid()
    other_run = wid(run=run_key("run-2"))
    assert me.sees(me.run_token()) is Seen.OURS
    assert me.sees(wid(batch=2).bump_token(1)) is Seen.OURS  # a bump of an earlier batch
    assert me.sees(wid(partition=5).bump_token(1)) is Seen.OURS_BUMPED
    assert me.sees(wid(batch=4).bump_token(1)) is Seen.NEWER
    assert me.sees(other_run.run_token()) is Seen.EARLIER_RUN
    assert me.sees(other_run.bump_token(2)) is Seen.EARLIER_RUN
    assert me.sees(f"wRs{me.query}.1.2.0.0.7") is Seen.EARLIER_RUN
    assert me.sees("") is Seen.EMPTY
    assert me.sees(wid(query=query_key("q2")).run_token()) is Seen.OTHER_WRITER
    assert me.sees("someone-else") is Seen.FOREIGN
    job = wid(streaming=False, query="job", batch=0)
    assert job.sees("") is Seen.OURS and job.sees(me.run_token()) is Seen.OTHER_WRITER
    assert job.sees(wid(streaming=False, query="job", run=run_key("j2")).run_token()) \
        is Seen.OTHER_WRITER


def test_plain_write_in_order(basin: Any, unique: Callable[[str], str]) -> None:
    """Every append carries its data, the writer's mark and the run's token, which the
    stream keeps."""
    name = unique("s")
    basin.create_stream(name)
    sink = StreamSink(basin, name, wid(), SMALL)
    headers = pa.array([[{"name": b"k", "value": b"v"}]] * 1500,
                       pa.list_(pa.struct([("name", pa.binary()), ("value", pa.binary())])))
    sink.add(bodies(1500), headers)
    sink.add(bodies(1000, start=1500))
    result = sink.close()
    assert result.appended == 2500 and result.skipped == 0 and result.appends == 3
    rows = data_rows(basin, name)
    assert [b for b, _ in rows] == [f"r{i}".encode() for i in range(2500)]
    assert rows[0][1] == [(b"k", b"v")] and rows[-1][1] == []
    run = wid().run_token()
    # Each mark: the progress, and the digest of the rows so far as they were encoded.
    entries = EncodedRecords.concat([encode_entries(bodies(1500), headers),
                                     encode_entries(bodies(1000, start=1500))])

    def mark(n: int) -> str:
        return wid().mark(n, digest=RowsDigest().extend(entries.slice(0, n).payload)).encode()

    assert fences(basin, name) == [mark(PER), run, mark(2 * PER), run, mark(2500), run]
    assert token(basin, name) == run


def test_appends_cut_across_input_batches(basin: Any, unique: Callable[[str], str]) -> None:
    """Appends are cut from the input batches as they came (no concatenation): records
    of one append from several batches, tiny and large ones, land in order, each mark
    holds the digest of exactly the rows before it (however they were cut), and a retry
    fed the same rows in other batches skips the landed ones."""
    name = unique("s")
    basin.create_stream(name)
    sizes = [3, 700, 1, 1, 600, 2000, 5, 1700]  # 5010 rows, appends span batches
    wide = [f"{i:04d}".encode() * 150 for i in range(sum(sizes))]  # 600 B rows

    def feed(sink: StreamSink, cuts: list[int]) -> None:
        at = 0
        for n in cuts:
            sink.add(pa.array(wide[at:at + n], pa.binary()))
            at += n

    def die(sink: StreamSink) -> None:
        if sink.appends == 2:
            raise Boom()

    first = StreamSink(basin, name, wid(), SMALL, after_append=die)
    with pytest.raises(Boom):
        feed(first, sizes)
    retry = StreamSink(basin, name, wid(attempt=1), SMALL)
    feed(retry, [2500, 10, 2500])
    result = retry.close()
    assert (result.skipped, result.appended) == (2 * PER, len(wide) - 2 * PER)
    assert [b for b, _ in data_rows(basin, name)] == wide
    entries = encode_entries(pa.array(wide, pa.binary()))
    found = [(m.progress, m.digest) for m in marks(basin, name) if m.digest is not None]
    assert found == [(n, RowsDigest().extend(entries.slice(0, n).payload).text()[:10])
                     for n in (PER, 2 * PER, 3 * PER, 4 * PER, 5 * PER, len(wide))]


def test_missing_stream(basin: Any, unique: Callable[[str], str]) -> None:
    name = unique("s")
    sink = StreamSink(basin, name, wid(), SMALL)
    sink.add(bodies(3))
    with pytest.raises(NotFoundError, match="createStreams=true"):
        sink.close()
    sink = StreamSink(basin, name, wid(), SinkSettings(create_streams=True))
    sink.add(bodies(3))
    sink.close()
    assert len(data_rows(basin, name)) == 3


def test_retry_after_partial_write_resumes(basin: Any, unique: Callable[[str], str]) -> None:
    """Attempt 0 dies after 2 appends; attempt 1 bumps, reads the marks back and writes
    the rest; attempt 0, going on, is refused and finds attempt 1's mark: it stops."""
    name = unique("s")
    basin.create_stream(name)

    def die(sink: StreamSink) -> None:
        if sink.appends == 2:
            raise Boom()

    first = StreamSink(basin, name, wid(), SMALL, after_append=die)
    with pytest.raises(Boom):
        first.add(bodies(5000))
    assert len(data_rows(basin, name)) == 2 * PER
    retry = StreamSink(basin, name, wid(attempt=1), SMALL)
    retry.add(bodies(5000))
    result = retry.close()
    assert result.skipped == 2 * PER and result.appended == 5000 - 2 * PER
    assert [b for b, _ in data_rows(basin, name)] == [f"r{i}".encode() for i in range(5000)]
    assert token(basin, name) == wid(attempt=1).bump_token(1)
    with pytest.raises(WriterFencedError, match="attempt 1 of this task"):
        first.add(bodies(5000, start=5000))
        first.close()
    assert len(data_rows(basin, name)) == 5000


def test_restart_with_other_partitions_in_between(basin: Any, unique: Callable[[str], str]) -> None:
    """Old run: p0 wrote part, p1 wrote all. New run (newer generation) replays both."""
    name = unique("s")
    basin.create_stream(name)

    def die(sink: StreamSink) -> None:
        if sink.appends == 1:
            raise Boom()

    p0 = StreamSink(basin, name, wid(), SMALL, after_append=die)
    with pytest.raises(Boom):
        p0.add(bodies(2500, "a"))
    p1 = StreamSink(basin, name, wid(partition=1), SMALL)
    p1.add(bodies(1200, "b"))
    p1.close()
    # Restart: run 2, generation 2000 replays batch 3; both partitions resume exactly.
    run2: dict[str, Any] = dict(run=run_key("run-2"), generation=2000)
    n0 = StreamSink(basin, name, wid(**run2), SMALL)
    n0.add(bodies(2500, "a"))
    r0 = n0.close()
    n1 = StreamSink(basin, name, wid(partition=1, **run2), SMALL)
    n1.add(bodies(1200, "b"))
    r1 = n1.close()
    assert (r0.skipped, r0.appended, r1.skipped, r1.appended) == (PER, 2500 - PER, 1200, 0)
    got = [b for b, _ in data_rows(basin, name)]
    a = [f"a{i}".encode() for i in range(2500)]
    b = [f"b{i}".encode() for i in range(1200)]
    assert got == a[:PER] + b + a[PER:]
    # The takeover found the earlier run's rows of batch 3: a token only it knows.
    assert token(basin, name) == wid(**run2).bump_token(1)
    # A writer of the killed run (older generation) is stale now.
    old = StreamSink(basin, name, wid(partition=1, attempt=1), SMALL)
    with pytest.raises(WriterFencedError, match="newer run"):
        old.add(bodies(1200, "b"))
        old.close()
    # So is a writer of an earlier micro-batch, once batch 4 has written.
    b4 = StreamSink(basin, name, wid(run=run_key("run-2"), generation=3000, batch=4), SMALL)
    b4.add(bodies(10, "c"))
    b4.close()
    late = StreamSink(basin, name, wid(partition=2, **run2), SMALL)
    late.add(bodies(10, "x"))
    with pytest.raises(WriterFencedError, match="newer micro-batch"):
        late.close()
    assert len(data_rows(basin, name)) == 2500 + 1200 + 10


def test_restart_between_micro_batches_takes_over_once(
    basin: Any, unique: Callable[[str], str]
) -> None:
    """A run stopped between micro-batches: the next run's first writer takes the stream
    over (its run's token, nothing to read past the earlier batch's marks) and the next
    writer of that run appends under it at once."""
    name = unique("s")
    basin.create_stream(name)
    for p in (0, 1):
        sink = StreamSink(basin, name, wid(partition=p), SMALL)
        sink.add(bodies(5, f"p{p}-"))
        sink.close()
    run2: dict[str, Any] = dict(run=run_key("run-2"), generation=2000, batch=4)
    first = StreamSink(basin, name, wid(**run2), SMALL)
    first.add(bodies(3, "n0-"))
    assert first.close().appends == 1
    assert token(basin, name) == wid(**run2).run_token()
    second = StreamSink(basin, name, wid(partition=1, **run2), SMALL)
    second.add(bodies(3, "n1-"))
    assert second.close().appends == 1
    assert len(data_rows(basin, name)) == 16


def test_zombie_that_never_wrote_is_rejected(basin: Any, unique: Callable[[str], str]) -> None:
    """Attempt 1 wrote; attempt 0 (still running) then tries to write."""
    name = unique("s")
    basin.create_stream(name)
    other = StreamSink(basin, name, wid(partition=1), SMALL)
    other.add(bodies(5, "o"))
    other.close()
    newer = StreamSink(basin, name, wid(attempt=1), SMALL)
    newer.add(bodies(7))
    newer.close()
    third = StreamSink(basin, name, wid(partition=2), SMALL)
    third.add(bodies(4, "t"))
    third.close()
    zombie = StreamSink(basin, name, wid(attempt=0), SMALL)
    zombie.add(bodies(7))
    with pytest.raises(WriterFencedError):
        zombie.close()
    assert len(data_rows(basin, name)) == 5 + 7 + 4


def test_partitions_write_at_once(basin: Any, unique: Callable[[str], str]) -> None:
    """Two partitions writing one stream at the same time: nobody waits or is refused,
    each partition's rows land once and in input order, one append per 998 rows."""
    name = unique("s")
    basin.create_stream(name)
    errors: list[BaseException] = []
    results: list[Any] = []
    start = threading.Barrier(2, timeout=60)

    def run(p: int) -> None:
        try:
            sink = StreamSink(basin, name, wid(partition=p), SMALL)
            start.wait()
            for k in range(4):
                sink.add(bodies(600, f"p{p}-", start=600 * k))
            results.append(sink.close())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(r.appends for r in results) == [3, 3]
    got = [b for b, _ in data_rows(basin, name)]
    for p in (0, 1):
        mine = [b for b in got if b.startswith(f"p{p}-".encode())]
        assert mine == [f"p{p}-{i}".encode() for i in range(2400)]
    assert len(got) == 4800


def test_two_attempts_of_one_task_racing(basin: Any, unique: Callable[[str], str]) -> None:
    """Attempts 0 and 1 of one task write the same rows at once (a speculative attempt):
    every row lands once, in order; whichever attempt lost stops as stale."""
    name = unique("s")
    basin.create_stream(name)
    settings = SinkSettings(max_records=50, flush_records=100)
    outcomes: dict[int, Any] = {}
    start = threading.Barrier(2, timeout=60)

    def run(attempt: int) -> None:
        try:
            sink = StreamSink(basin, name, wid(attempt=attempt), settings)
            start.wait()
            for k in range(30):
                sink.add(bodies(100, start=100 * k))
            outcomes[attempt] = sink.close()
        except BaseException as exc:
            outcomes[attempt] = exc

    threads = [threading.Thread(target=run, args=(a,)) for a in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [b for b, _ in data_rows(basin, name)] == bodies(3000).to_pylist()
    assert not isinstance(outcomes[1], BaseException) or not isinstance(
        outcomes[0], BaseException), outcomes
    for o in outcomes.values():
        assert not isinstance(o, BaseException) or isinstance(o, WriterFencedError), o


def test_stream_of_the_previous_release_is_taken_over(
    basin: Any, unique: Callable[[str], str]
) -> None:
    """The release before this one left lease tokens (a fence record per append, the
    lease with its progress). A run of the same query replaying that micro-batch reads
    them as marks and resumes after them."""
    name = unique("s")
    basin.create_stream(name)
    q = wid().query
    stream = basin.stream(name)
    # Partition 0 of batch 3, generation 1000, wrote 4 rows then was killed holding it.
    stream.append([AppendRecord(f"r{i}".encode()) for i in range(4)]
                  + [AppendRecord.fence(f"wLS{q}.rs.3.0.0.4")])
    run2 = wid(run=run_key("run-2"), generation=2000)
    sink = StreamSink(basin, name, run2, SMALL)
    sink.add(bodies(10))
    result = sink.close()
    assert (result.skipped, result.appended) == (4, 6)
    assert [b for b, _ in data_rows(basin, name)] == bodies(10).to_pylist()


def test_record_too_large(basin: Any, unique: Callable[[str], str]) -> None:
    name = unique("s")
    basin.create_stream(name)
    sink = StreamSink(basin, name, wid(), SMALL)
    big = b"x" * (1024 * 1024)
    sink.add(pa.array([b"ok", big, b"after"], pa.binary()))
    with pytest.raises(RecordTooLargeError) as info:
        sink.close()
    assert info.value.metered_bytes == 1024 * 1024 + 8
    assert info.value.limit in (1024 * 1024, DATA_MAX_BYTES)
    assert str(1024 * 1024 + 8) in str(info.value)
    assert [b for b, _ in data_rows(basin, name)] in ([], [b"ok"])


def test_foreign_token(basin: Any, unique: Callable[[str], str]) -> None:
    name = unique("s")
    basin.create_stream(name)
    basin.stream(name).fence("someone-else")
    sink = StreamSink(basin, name, wid(), SMALL)
    sink.add(bodies(1))
    with pytest.raises(ForeignFenceError):
        sink.close()


def test_fence_records_keep_client_timestamps(basin: Any, unique: Callable[[str], str]) -> None:
    """Fence records carry timestamp 0, so S2's monotonic clamp never moves user times."""
    name = unique("s")
    basin.create_stream(name)
    t0 = 1_600_000_000_000
    sink = StreamSink(basin, name, wid(), SMALL)
    sink.add(bodies(1500), None, pa.array([t0 + i for i in range(1500)], pa.int64()))
    sink.close()
    got = [int(r["timestamp"].timestamp() * 1000)
           for r in all_records(basin, name, commands=False)]
    assert got == [t0 + i for i in range(1500)]
