"""One writer routing rows to many S2 streams (s2_spark.backends.s2.sink), without Spark.

Rows are grouped by stream in one pass, streams are written several at once within a
writer (a bounded number of appends in flight in total), and partitions of one
micro-batch write the same streams at once. Real appends against the local server; every
test reads back exact records: each row once, in input order per stream and partition,
and the stream left under the run's token. Waits have deadlines; nothing depends on
timing.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from test_s2_sink import bodies, data_rows, marks, token, wid

from s2_spark.backends._sink_rows import drop_command_rows, group_by_stream
from s2_spark.backends.s2._history import StreamMarks, first_window, read_windows
from s2_spark.backends.s2.sink import PartitionWriter, SinkSettings, StreamSink
from s2_spark.backends.s2.tokens import Seen, WriterId, run_key
from s2_spark.errors import S2SparkError, WriterFencedError
from s2_spark.s2 import S2Client, S2Config, SmallRead
from s2_spark.testing import TcpProxy
from s2_spark.wire.records import HEADER_TYPE, DecodedBatch

pytestmark = pytest.mark.backend

DEADLINE = 60.0


class Boom(Exception):
    pass


# -- helpers ------------------------------------------------------------------------------

Hook = Callable[[str, str, int], None]


class SpyBasin:
    """A basin whose streams count the appends in flight across all of them (`most`: the
    highest count seen) and call `hook(stream, kind, n)` before the n-th (from 1) append
    of a kind ("fence": a one-record append, "chain": a session) on a stream."""

    def __init__(self, basin: Any, hook: Hook | None = None) -> None:
        self._basin = basin
        self.name = basin.name
        self.endpoint_url = basin.endpoint_url
        self.hook = hook
        self.most = 0
        self._in_flight = 0
        self._calls: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def stream(self, name: str) -> SpyStream:
        return SpyStream(self, self._basin.stream(name))

    def create_stream(self, name: str) -> Any:
        return self._basin.create_stream(name)

    def create_streams(self, names: list[str]) -> None:
        self._basin.create_streams(names)

    def append_each(self, appends: list[Any], *, in_flight: int, **kw: Any) -> list[Any]:
        """Appends to many streams sent together: each counts as a one-append chain, and
        at most `in_flight` are in flight (the fan-out's own bound)."""
        for a in appends:
            self.call(a.stream, "chain", 0, lambda: None)
        with self._lock:
            self.most = max(self.most, min(in_flight, len(appends)))
        return self._basin.append_each(appends, in_flight=in_flight, **kw)

    def append_bodies(self, streams: list[str], bodies: list[bytes], sizes: list[int], *,
                      in_flight: int, **kw: Any) -> Any:
        """A writer's first appends to many streams, built in bulk: counted as
        `append_each`'s."""
        for s in streams:
            self.call(s, "chain", 0, lambda: None)
        with self._lock:
            self.most = max(self.most, min(in_flight, len(streams)))
        return self._basin.append_bodies(streams, bodies, sizes, in_flight=in_flight, **kw)

    def calls(self, stream: str) -> dict[str, int]:
        """Appends of each kind made to `stream` so far."""
        with self._lock:
            return {kind: n for (s, kind), n in self._calls.items() if s == stream}

    def call(self, stream: str, kind: str, n: int, op: Callable[[], Any]) -> Any:
        with self._lock:
            k = self._calls[(stream, kind)] = self._calls.get((stream, kind), 0) + 1
        if self.hook is not None:
            self.hook(stream, kind, k)
        with self._lock:
            self._in_flight += n
            self.most = max(self.most, self._in_flight)
        try:
            return op()
        finally:
            with self._lock:
                self._in_flight -= n


class SpyStream:
    def __init__(self, spy: SpyBasin, stream: Any) -> None:
        self._spy = spy
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def append_payload(self, batch: Any, **kw: Any) -> Any:
        return self._spy.call(self._stream.name, "fence", 1,
                              lambda: self._stream.append_payload(batch, **kw))

    def append_chain(self, batches: Any, **kw: Any) -> Any:
        return self._spy.call(self._stream.name, "chain", len(batches),
                              lambda: self._stream.append_chain(batches, **kw))


Plan = list[tuple[bytes, list[tuple[bytes, bytes]], str]]


def plan_rows(n: int, target: Callable[[int], str], pad: int = 0) -> Plan:
    """`n` rows (body, headers, stream), bodies padded to `pad` bytes; odd rows carry a
    header."""
    return [(f"r{i}".encode().ljust(pad, b"."), [(b"i", str(i).encode())] if i % 2 else [],
             target(i)) for i in range(n)]


def feed(writer: PartitionWriter, plan: Plan, sizes: list[int]) -> None:
    """Add `plan` in chunks of the given sizes (cycled), as Arrow columns."""
    pos, k = 0, 0
    while pos < len(plan):
        chunk = plan[pos:pos + sizes[k % len(sizes)]]
        writer.add(
            pa.array([b for b, _, _ in chunk], pa.binary()),
            pa.array([[{"name": n, "value": v} for n, v in h] for _, h, _ in chunk],
                     HEADER_TYPE),
            None,
            pa.array([s for _, _, s in chunk], pa.string()),
        )
        pos, k = pos + len(chunk), k + 1


def per_stream(plan: Plan) -> dict[str, list[tuple[bytes, list[tuple[bytes, bytes]]]]]:
    out: dict[str, list[tuple[bytes, list[tuple[bytes, bytes]]]]] = {}
    for body, headers, stream in plan:
        out.setdefault(stream, []).append((body, headers))
    return out


def assert_written_once(basin: Any, plan: Plan) -> None:
    """Every stream holds exactly its rows of `plan`, in order, under a token of the
    writers' run, and its last mark counts them."""
    for stream, want in per_stream(plan).items():
        assert data_rows(basin, stream) == want, stream
        assert wid().sees(token(basin, stream)) in (Seen.OURS, Seen.OURS_BUMPED), stream
        assert [m.progress for m in marks(basin, stream) if m.data][-1] == len(want)


def new_streams(basin: Any, unique: Callable[[str], str], n: int, *,
                written: bool = False) -> list[str]:
    """`n` new streams; `written`: as the writers' run left them (under its token), the
    steady state of a query past its first micro-batch."""
    names = [unique(f"m{k:02d}") for k in range(n)]
    for name in names:
        basin.create_stream(name)
        if written:
            basin.stream(name).fence(wid().run_token())
    return names


# -- grouping (no server) -----------------------------------------------------------------


def test_grouping_keeps_input_order_per_stream() -> None:
    """500 streams, 20,000 rows in random order: one group per stream, streams in
    first-seen order, each group's rows (all three columns) in input order."""
    rng = random.Random(5)
    names = [f"s{k}" for k in range(500)]
    targets = [rng.choice(names) for _ in range(20_000)]
    bodies = pa.array([f"b{i}".encode() for i in range(len(targets))], pa.binary())
    headers = pa.array([[{"name": b"i", "value": str(i).encode()}] if i % 3 else None
                        for i in range(len(targets))], HEADER_TYPE)
    stamps = pa.array([i if i % 5 else None for i in range(len(targets))], pa.int64())
    groups = group_by_stream((bodies, headers, stamps), pa.array(targets, pa.string()))
    assert [g for g, _ in groups] == list(dict.fromkeys(targets))
    for name, (b, h, t) in groups:
        rows = [i for i, s in enumerate(targets) if s == name]
        assert b.to_pylist() == [f"b{i}".encode() for i in rows]
        assert h is not None and h.to_pylist() == headers.take(rows).to_pylist()
        assert t is not None and t.to_pylist() == stamps.take(rows).to_pylist()
    one = group_by_stream((bodies, None, None), pa.array(["x"] * len(targets), pa.string()))
    assert len(one) == 1 and one[0][0] == "x" and one[0][1][0] is bodies


def test_command_rows_are_dropped_with_their_streams() -> None:
    fence = [{"name": b"", "value": b"fence"}]
    headers = pa.array([None, fence, [{"name": b"k", "value": b"v"}], fence], HEADER_TYPE)
    bodies = pa.array([b"a", b"tok", b"c", b""], pa.binary())
    streams = pa.array(["s1", "s2", "s2", "s1"], pa.string())
    (b, h, t), s, dropped = drop_command_rows((bodies, headers, None), streams)
    assert dropped == 2 and b.to_pylist() == [b"a", b"c"] and t is None
    assert isinstance(s, pa.Array) and s.to_pylist() == ["s1", "s2"]
    assert h is not None and h.to_pylist() == [None, [{"name": b"k", "value": b"v"}]]


def test_null_stream_is_named(basin: Any) -> None:
    w = PartitionWriter(basin, wid(), SinkSettings())
    with pytest.raises(S2SparkError, match="row 2 of this batch has a null `stream` column"):
        w.add(pa.array([b"a", b"b", b"c"]), None, None, pa.array(["s", "s", None]))


# -- one writer, many streams ---------------------------------------------------------------


def test_many_streams_once_in_order(basin: Any, unique: Callable[[str], str]) -> None:
    """5000 interleaved rows to 50 streams: one big stream flushes while rows come in,
    49 small ones are written at close, several at once within a bound of 4 appends in
    flight. Each stream: its rows once, in order; a small stream costs one append (its
    rows, the mark, the token)."""
    names = new_streams(basin, unique, 50, written=True)
    plan = plan_rows(5000, lambda i: names[0] if i % 5 == 0 else names[1 + (i * 31) % 49])
    spy = SpyBasin(basin)
    settings = SinkSettings(max_records=100, flush_records=300, max_inflight_appends=4)
    w = PartitionWriter(spy, wid(), settings)  # type: ignore[arg-type]
    feed(w, plan, [1, 999, 1500, 700])
    results = w.close()
    assert [r.stream for r in results] == list(dict.fromkeys(s for _, _, s in plan))
    assert sum(r.appended for r in results) == 5000
    assert all(r.skipped == 0 for r in results)
    assert_written_once(basin, plan)
    for name, want in per_stream(plan).items():
        if name != names[0]:
            assert spy.calls(name) == {"chain": 1}, name
            assert basin.stream(name).check_tail().seq_num == 1 + len(want) + 2
    assert spy.most <= 4


def test_close_writes_streams_at_once(basin: Any, unique: Callable[[str], str]) -> None:
    """Three buffered streams of more than one append each are flushed by three threads
    at once: each stream's first append waits at a barrier that only opens when all
    three are there."""
    names = new_streams(basin, unique, 3)
    barrier = threading.Barrier(3, timeout=DEADLINE)

    def meet(stream: str, kind: str, n: int) -> None:
        if kind == "chain" and n == 1:
            barrier.wait()

    w = PartitionWriter(SpyBasin(basin, meet), wid(),  # type: ignore[arg-type]
                        SinkSettings(max_records=4, max_inflight_appends=9))
    plan = plan_rows(30, lambda i: names[i % 3])
    feed(w, plan, [30])
    w.close()
    assert_written_once(basin, plan)


# -- partitions of one micro-batch sharing streams ----------------------------------------


def _run_1(p: int) -> WriterId:
    """Partition p's writer of the writers' micro-batch (`wid`'s)."""
    return wid(partition=p)


def _run_partitions(basin: Any, plans: list[Plan], settings: SinkSettings,
                    sizes: list[int], writer: Callable[[int], WriterId] = _run_1) -> None:
    """Write each plan as its own partition of one micro-batch (`writer(p)`: partition
    p's writer), all from their own threads started together; raise the first error."""
    start = threading.Barrier(len(plans), timeout=DEADLINE)
    errors: list[BaseException] = []

    def run(p: int) -> None:
        try:
            w = PartitionWriter(basin, writer(p), settings)
            start.wait()
            feed(w, plans[p], sizes)
            w.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert not any(t.is_alive() for t in threads), "the partitions did not finish"
    if errors:
        raise errors[0]


def _check_partitions(basin: Any, plans: list[Plan]) -> None:
    """Every row once; per stream, each partition's rows in input order."""
    for stream in {s for plan in plans for _, _, s in plan}:
        got = [b for b, _ in data_rows(basin, stream)]
        assert sorted(got) == sorted(b for plan in plans for b, _, s in plan if s == stream)
        for p, plan in enumerate(plans):
            want = [b for b, _, s in plan if s == stream]
            at = [i for i, b in enumerate(got) if b.startswith(f"p{p}-".encode())]
            assert [got[i] for i in at] == want, (stream, p)


@pytest.mark.local_server  # counts the local server's requests
def test_partitions_share_streams_at_once(
    s2_server: Any, basin: Any, unique: Callable[[str], str]
) -> None:
    """Partitions 0 and 1 write streams 0-19 and 10-29 (10 shared) at the same time,
    everything flushed at close: every row once, each partition's rows in input order,
    and not one append refused (nobody waits for or guesses another's token)."""
    names = new_streams(basin, unique, 30, written=True)
    mine = [names[:20], names[10:][::-1]]
    plans: list[Plan] = []
    for p in (0, 1):
        counts = {s: 250 if s in names[10:20] else 40 for s in mine[p]}
        order = [s for k in range(250) for s in mine[p] if k < counts[s]]
        plans.append([(f"p{p}-{i}".encode(), [], s) for i, s in enumerate(order)])
    before = s2_server.append_counts()
    _run_partitions(basin, plans, SinkSettings(max_records=100), [777])
    after = s2_server.append_counts()
    _check_partitions(basin, plans)
    appends = 2 * (10 * 1 + 10 * 3)  # per partition: 10 streams of 40 rows, 10 of 250
    assert after.get("refused", 0) - before.get("refused", 0) == 0
    assert after["landed"] - before.get("landed", 0) == appends


def _run_2(p: int) -> WriterId:
    """Partition p's writer of micro-batch 4 in a later run of the query (restarted from
    its checkpoint after the run of `wid`)."""
    return wid(run=run_key("run-2"), generation=2000, batch=4, partition=p)


@pytest.fixture
def own_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The streams writers read marks from one at a time (`StreamMarks._fences`), a name
    per read."""
    reads: list[str] = []
    fences = StreamMarks._fences

    def counted(self: StreamMarks, lo: int, hi: int) -> list[tuple[int, str]]:
        reads.append(self._stream.name)
        return fences(self, lo, hi)

    monkeypatch.setattr(StreamMarks, "_fences", counted)
    return reads


def test_a_new_run_takes_over_many_streams_reading_their_marks_in_bulk(
    basin: Any, unique: Callable[[str], str], own_reads: list[str]
) -> None:
    """A query restarted from its checkpoint meets the earlier run's token on every
    stream: partitions 0 and 1 of its first micro-batch take over 40 streams (20 shared)
    with the tails and the marks before them read for all streams together, none by a
    stream alone. Every row once, each partition's rows in input order, every stream
    left under the new run's token."""
    names = new_streams(basin, unique, 40, written=True)
    mine = [names[:30], names[10:][::-1]]
    before = [[(f"p{p}-a{i}".encode(), [], s) for i, s in enumerate(mine[p] * 2)]
              for p in (0, 1)]
    _run_partitions(basin, before, SinkSettings(), [1000])  # run 1, micro-batch 3
    own_reads.clear()
    after = [[(f"p{p}-b{i}".encode(), [], s) for i, s in enumerate(mine[p])] for p in (0, 1)]
    _run_partitions(basin, after, SinkSettings(), [1000], writer=_run_2)
    assert own_reads == []
    _check_partitions(basin, [before[p] + after[p] for p in (0, 1)])
    for name in names:
        assert _run_2(0).sees(token(basin, name)) in (Seen.OURS, Seen.OURS_BUMPED), name


def test_a_new_run_replaying_a_micro_batch_over_many_streams_writes_each_row_once(
    basin: Any, unique: Callable[[str], str], own_reads: list[str]
) -> None:
    """The earlier run wrote part of partition 0's micro-batch 4 before it stopped: two
    rows to each of 30 streams, and 100 to one more (its marks before them reach past
    the first window read back in bulk, so that stream reads on alone). The new run
    replays micro-batch 4 from both partitions: the rows found are not written again,
    every row once, each partition's rows in input order."""
    names = new_streams(basin, unique, 31, written=True)
    big = names[0]
    plans = [[(f"p{p}-{i}".encode(), [], s) for i, s in
              enumerate([big] * 150 + names[1:] * 3 if p == 0 else names[::-1] * 2)]
             for p in (0, 1)]
    landed = [row for row in plans[0] if row[2] == big][:100] + [
        row for row in plans[0] if row[2] != big][:60]
    killed = PartitionWriter(basin, wid(batch=4), SinkSettings())
    feed(killed, landed, [1000])
    killed.close()
    own_reads.clear()
    _run_partitions(basin, plans, SinkSettings(), [1000], writer=_run_2)
    assert big in own_reads
    _check_partitions(basin, plans)


@pytest.mark.parametrize(("per_stream", "streams", "sizes"), [
    (1 << 20, 100, [32, 16, 16, 16, 16, 4]),  # 1 MiB read back a stream: 16 at a time
    (10_000, 1100, [32, 1024, 44]),  # 100 B records: up to 1024 streams at a time
])
def test_takeovers_are_read_in_windows_that_hold_a_bounded_size(
    monkeypatch: pytest.MonkeyPatch, per_stream: int, streams: int, sizes: list[int]
) -> None:
    """A writer reads its takeovers' marks 32 streams at first, then as many as held about
    16 MiB so far, at most 1024: a bulk read holds all its answers at once, so streams
    of big records are read back fewer at a time."""
    class Due:
        takes_over, settled = True, False

    windows: list[int] = []

    def together(self: PartitionWriter, due: list[Any]) -> int:
        windows.append(len(due))
        return per_stream * len(due)

    monkeypatch.setattr(PartitionWriter, "_take_over_together", together)
    w = PartitionWriter(None, wid(), SinkSettings())  # type: ignore[arg-type]
    w._read_takeovers([Due() for _ in range(streams)])  # type: ignore[misc]
    assert windows == sizes


def test_marks_read_in_bulk_are_the_ones_a_stream_reads_alone(
    basin: Any, unique: Callable[[str], str]
) -> None:
    """`read_windows` over `read_many`'s reads gives each stream the fence records the
    stream's own `StreamMarks._fences` reads of the same window: for streams of 10 to 157
    records (windows from a stream's first record, and within it); a failed read and one
    cut short give None (the stream reads on alone), an empty one no fences."""
    names = new_streams(basin, unique, 4, written=True)
    for k, name in enumerate(names):  # 3 micro-batches: rows, marks and tokens
        for batch in range(3):
            w = PartitionWriter(basin, wid(batch=batch), SinkSettings(max_records=7))
            feed(w, plan_rows(1 + 13 * k, lambda i, n=name: n), [1000])
            w.close()
    ends = [basin.stream(name).check_tail().seq_num for name in names]
    reads = [SmallRead(n, first_window(e), e - first_window(e))
             for n, e in zip(names, ends, strict=True)]
    got = read_windows(basin.read_many(reads), ends)
    for name, end, fences in zip(names, ends, got, strict=True):
        alone = StreamMarks(basin.stream(name), wid())._fences(first_window(end), end)
        assert fences == alone and len(alone) >= 4, name
    cut = basin.read_many([reads[-1]])[0]
    assert isinstance(cut, DecodedBatch)
    short = DecodedBatch(cut.batch.slice(0, 3), cut.tail, 3, cut.first_seq_num,
                         cut.first_seq_num + 2, 0)
    empty = DecodedBatch(cut.batch.slice(0, 0), cut.tail, 0, None, None, 0)
    assert read_windows([S2SparkError("failed"), short, empty], [ends[-1]] * 3) == [
        None, None, []]


def test_partitions_flushing_the_same_streams_while_adding(
    basin: Any, unique: Callable[[str], str]
) -> None:
    """Both partitions flush the same 6 streams while rows come in, in opposite orders,
    several appends in flight: both finish, every row once, in order per partition."""
    names = new_streams(basin, unique, 6)
    plans: list[Plan] = []
    for p, order in ((0, names), (1, names[::-1])):
        plans.append([(f"p{p}-{i}".encode(), [], order[i % 6]) for i in range(6000)])
    settings = SinkSettings(max_records=100, flush_records=200, max_inflight_appends=3)
    _run_partitions(basin, plans, settings, [1200])
    _check_partitions(basin, plans)


# -- failures and replays -----------------------------------------------------------------


def test_failed_stream_stops_the_others_and_replay_is_exact(
    basin: Any, unique: Callable[[str], str]
) -> None:
    """A stream's second data append fails while 20 streams are written at once: close
    raises that error and the others stop; attempt 1 with the same input skips what
    landed and writes the rest, each row once."""
    names = new_streams(basin, unique, 20, written=True)
    plan = plan_rows(6000, lambda i: names[i % 20])
    victim = names[7]

    def fail(stream: str, kind: str, n: int) -> None:
        if stream == victim and kind == "chain" and n == 2:
            raise Boom()

    settings = SinkSettings(max_records=100, max_inflight_appends=2)
    w = PartitionWriter(SpyBasin(basin, fail), wid(), settings)  # type: ignore[arg-type]
    feed(w, plan, [1000])
    with pytest.raises(Boom):
        w.close()
    landed = {s: len(data_rows(basin, s)) for s in names}
    assert 100 <= landed[victim] < 300
    assert sum(landed.values()) < 6000
    retry = PartitionWriter(basin, wid(attempt=1), settings)
    feed(retry, plan, [1000])
    results = retry.close()
    assert sum(r.skipped for r in results) == sum(landed.values())
    assert sum(r.appended for r in results) == 6000 - sum(landed.values())
    assert_written_once(basin, plan)


def test_frozen_attempt_is_replayed_and_fenced_out(
    basin: Any, unique: Callable[[str], str]
) -> None:
    """Attempt 0 freezes on a stream, part of it appended (a hung task); attempt 1 bumps
    every stream and writes everything exactly once; when attempt 0 wakes up its next
    append fails, it finds attempt 1's mark and stops without writing."""
    names = new_streams(basin, unique, 10, written=True)
    plan = plan_rows(3000, lambda i: names[i % 10])
    victim = names[3]
    frozen, wake = threading.Event(), threading.Event()

    def freeze(stream: str, kind: str, n: int) -> None:
        if stream == victim and kind == "chain" and n == 2:
            frozen.set()
            assert wake.wait(DEADLINE)

    settings = SinkSettings(max_records=100, max_inflight_appends=2)
    zombie = PartitionWriter(SpyBasin(basin, freeze), wid(), settings)  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def run_zombie() -> None:
        try:
            feed(zombie, plan, [3000])
            zombie.close()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run_zombie)
    t.start()
    try:
        assert frozen.wait(DEADLINE), "attempt 0 never reached its second append"
        assert 100 <= len(data_rows(basin, victim)) < 300
        newer = PartitionWriter(basin, wid(attempt=1), settings)
        feed(newer, plan, [3000])
        newer.close()
    finally:
        wake.set()
        t.join(DEADLINE)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], WriterFencedError), errors
    assert_written_once(basin, plan)


def test_lost_acks_while_another_partition_writes(
    s2_server: Any, basin: Any, unique: Callable[[str], str]
) -> None:
    """Partition 0's last chain lands but its acks never arrive; partition 1 writes the
    stream meanwhile. Partition 0 bumps, finds its own marks behind partition 1's rows and
    is done: each row once, nothing sent twice."""
    from test_spark_writer_pipeline import SessionGate, wait_until

    name = new_streams(basin, unique, 1, written=True)[0]
    gate = SessionGate(s2_server.url, "mute")
    errors: list[BaseException] = []
    results: list[Any] = []
    with S2Client(S2Config(endpoint=gate.url)) as client:
        first = StreamSink(client.basin(basin.name), name, wid(), SinkSettings())
        first.add(bodies(2500, "a"))

        def run() -> None:
            try:
                results.append(first.close())
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=run)
        try:
            t.start()
            tail = basin.stream(name).check_tail
            wait_until("the muted chain to land", lambda: tail().seq_num == 1 + 2500 + 3 * 2)
            second = StreamSink(basin, name, wid(partition=1), SinkSettings())
            second.add(bodies(100, "b"))
            second.close()
        finally:
            gate.release.set()
            t.join(DEADLINE)
            gate.close()
    assert not t.is_alive() and not errors, errors
    assert (results[0].appended, results[0].skipped) == (2500, 0)
    got = [b for b, _ in data_rows(basin, name)]
    assert got == bodies(2500, "a").to_pylist() + bodies(100, "b").to_pylist()
    assert basin.stream(name).check_tail().seq_num == 1 + 2600 + 4 * 2 + 2


def test_cutting_network_many_streams_exactly_once(
    s2_server: Any, basin: Any, unique: Callable[[str], str]
) -> None:
    """Connections cut every 4-32 KiB while 40 streams are written at once: appends whose
    outcome is unknown are settled by a bump and the marks, so each row lands once, in
    order."""
    names = new_streams(basin, unique, 40)
    plan = plan_rows(8000, lambda i: names[(i * 7) % 40], pad=100)
    with TcpProxy(s2_server.url, cut_after=(4 << 10, 32 << 10), seed=11) as proxy, \
            S2Client(S2Config(endpoint=proxy.url)) as client:
        w = PartitionWriter(client.basin(basin.name), wid(),
                            SinkSettings(max_records=50, flush_records=150))
        feed(w, plan, [2000])
        w.close()
        assert proxy.cuts >= 3
    assert_written_once(basin, plan)


def test_a_new_run_taking_over_many_streams_over_a_cutting_network_writes_each_row_once(
    s2_server: Any, basin: Any, unique: Callable[[str], str]
) -> None:
    """A restarted query's first micro-batch takes over 60 streams, its tails, marks and
    takeover appends in bulk, while connections are cut every 2-8 KiB: whatever a cut
    leaves unknown is settled alone, and each row lands once, in order."""
    names = new_streams(basin, unique, 60, written=True)
    before = [(f"p0-a{i}".encode(), [], s) for i, s in enumerate(names * 2)]
    _run_partitions(basin, [before], SinkSettings(), [1000])  # run 1, micro-batch 3
    after = [(f"p0-b{i}".encode(), [], s) for i, s in enumerate(names * 3)]
    with TcpProxy(s2_server.url, cut_after=(2 << 10, 8 << 10), seed=5) as proxy, \
            S2Client(S2Config(endpoint=proxy.url)) as client:
        w = PartitionWriter(client.basin(basin.name), _run_2(0), SinkSettings())
        feed(w, after, [1000])
        w.close()
        assert proxy.cuts >= 3
    _check_partitions(basin, [before + after])
    for name in names:
        assert _run_2(0).sees(token(basin, name)) in (Seen.OURS, Seen.OURS_BUMPED), name


def test_two_attempts_racing_over_many_streams(basin: Any, unique: Callable[[str], str]) -> None:
    """Attempts 0 and 1 of one task write the same rows to 200 streams at the same time
    (a speculative attempt), while partition 1 writes them too: every row lands once, each
    partition's rows in input order; an attempt that lost a stream stops as stale."""
    names = new_streams(basin, unique, 200, written=True)
    plans = [[(f"p{p}-{i}".encode(), [], names[(i * 13 + p) % 200]) for i in range(3000)]
             for p in (0, 1)]
    settings = SinkSettings(max_records=20, flush_records=40)
    start = threading.Barrier(3, timeout=DEADLINE)
    outcomes: list[BaseException | None] = []

    def run(p: int, attempt: int) -> None:
        try:
            w = PartitionWriter(basin, wid(partition=p, attempt=attempt), settings)
            start.wait()
            feed(w, plans[p], [500])
            w.close()
            outcomes.append(None)
        except BaseException as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=run, args=pa_) for pa_ in ((0, 0), (0, 1), (1, 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert not any(t.is_alive() for t in threads)
    assert all(o is None or isinstance(o, WriterFencedError) for o in outcomes), outcomes
    assert sum(o is None for o in outcomes) >= 2  # partition 1, and one attempt of 0
    _check_partitions(basin, plans)


@pytest.mark.local_server  # counts the local server's requests
def test_basin_creating_streams_on_append(s2_server: Any, unique: Callable[[str], str]) -> None:
    """In a basin with S2's `create_stream_on_append`, two partitions writing 30 missing
    streams (10 shared) with createStreams: no create request (no append was answered
    404), every row once,
    each partition's rows in input order."""
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        name = unique("auto")
        client.create_basin(name, config={"create_stream_on_append": True})
        basin = client.basin(name)
        names = [unique(f"a{k:02d}") for k in range(30)]
        mine = [names[:20], names[10:][::-1]]
        plans = [[(f"p{p}-{i}".encode(), [], s) for i in range(3) for s in mine[p]]
                 for p in (0, 1)]
        before = s2_server.request_counts()
        _run_partitions(basin, plans, SinkSettings(create_streams=True), [1000])
        after = s2_server.request_counts()
        _check_partitions(basin, plans)
        assert after.get("create_stream", 0) == before.get("create_stream", 0)
        assert sorted(s.name for s in basin.list_streams()) == sorted(names)


@pytest.mark.local_server  # counts the local server's requests
def test_a_write_creating_many_streams_creates_each_once(
    s2_server: Any, basin: Any, unique: Callable[[str], str]
) -> None:
    """One partition writing 40 missing streams (createStreams) in a basin without
    create_stream_on_append: one create request per stream, no more (the fan-out creates
    a stream when its append is answered 404, then sends the append again), every row once."""
    names = [unique(f"c{k:02d}") for k in range(40)]
    plan: Plan = [(f"p0-{i}".encode(), [], names[i % 40]) for i in range(120)]
    before = s2_server.request_counts()
    _run_partitions(basin, [plan], SinkSettings(create_streams=True), [1000])
    after = s2_server.request_counts()
    _check_partitions(basin, [plan])
    assert after.get("create_stream", 0) - before.get("create_stream", 0) == 40
