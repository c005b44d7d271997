"""S2S read sessions against the real local server: bounds, heartbeats, live records,
transparent reconnects through a fault-injecting TCP proxy (sever / freeze), and appends
whose responses are lost on the way back."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _s2_target import LOCAL_ONLY, is_local, s2_config, token

from s2_spark.errors import NotFoundError, ReadPastTailError, UnavailableError
from s2_spark.s2 import AppendRecord, RetryPolicy, S2Client, S2Config, StreamClient

TOKEN = "tok-SECRET-session-42"


class FaultProxy:
    """A TCP proxy in front of the server that can cut or freeze live connections.

    It records every request line sent through it, so tests can check what a reconnect
    asked for.
    """

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._conns: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self.request_lines: list[str] = []
        self.accepted = 0  # connections taken in all
        self.drop_next_response = threading.Event()
        self.advise_frame: int | None = None  # set "reconnect advised" on this S2S frame
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self._upstream))
            self.accepted += 1
            frozen = threading.Event()
            drop = threading.Event()  # this connection's next response is lost
            with self._lock:
                self._conns.append((down, up, frozen))
            threading.Thread(
                target=self._pump, args=(down, up, frozen, drop, True), daemon=True
            ).start()
            rewrite = _AdviseRewriter(self.advise_frame) if self.advise_frame is not None else None
            self.advise_frame = None  # only the next connection
            threading.Thread(
                target=self._pump, args=(up, down, frozen, drop, False, rewrite), daemon=True
            ).start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        frozen: threading.Event,
        drop: threading.Event,
        upstream: bool,
        rewrite: _AdviseRewriter | None = None,
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if upstream:
                    for line in data.split(b"\r\n"):
                        if line.startswith((b"GET ", b"POST ", b"PUT ", b"DELETE ")):
                            with self._lock:
                                self.request_lines.append(line.decode())
                                # Arm on the request itself, so the late tail of an
                                # earlier response can never take the fault instead.
                                if self.drop_next_response.is_set():
                                    self.drop_next_response.clear()
                                    drop.set()
                if frozen.is_set():
                    continue  # swallow: the peer sees silence
                if not upstream and drop.is_set():
                    # The request was served, but its response is lost on the way back.
                    break
                if rewrite is not None:
                    data = rewrite.feed(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def sever(self) -> None:
        """Abruptly close every live connection (like a crashed server)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for down, up, _ in conns:
            for s in (down, up):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)  # wakes the pump threads blocked in recv
                s.close()

    def freeze(self) -> None:
        """Stop forwarding on every live connection (new ones still work)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for _, _, frozen in conns:
            frozen.set()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.sever()


class _AdviseRewriter:
    """Sets the "reconnect advised" flag bit on the n-th S2S frame of an HTTP/1.1
    response (chunked, or with a Content-Length when the server had it all at once), as a
    draining S2 server would, leaving every length unchanged."""

    def __init__(self, frame_index: int) -> None:
        self.target = frame_index
        self.state = "headers"
        self.line = b""  # the current header block / chunk-size line / chunk CRLF
        self.chunk_left = 0
        self.len_bytes = b""  # the current frame's length prefix, while incomplete
        self.frame_left = 0  # bytes of the current frame after its length prefix
        self.frames = 0
        self.flag_next = False

    def feed(self, data: bytes) -> bytes:
        out = bytearray(data)
        i = 0
        while i < len(out):
            if self.state in ("headers", "size", "crlf"):
                self.line += out[i : i + 1]
                i += 1
                if self.state == "headers" and self.line.endswith(b"\r\n\r\n"):
                    chunked = b"transfer-encoding: chunked" in self.line.lower()
                    self.state, self.line = ("size" if chunked else "plain"), b""
                elif self.state == "size" and self.line.endswith(b"\r\n"):
                    self.chunk_left = int(self.line[:-2].split(b";")[0], 16)
                    self.state = "data" if self.chunk_left else "done"
                    self.line = b""
                elif self.state == "crlf" and len(self.line) == 2:
                    self.state, self.line = "size", b""
            elif self.state == "data":
                self._body_byte(out, i)
                i += 1
                self.chunk_left -= 1
                if self.chunk_left == 0:
                    self.state = "crlf"
            elif self.state == "plain":
                self._body_byte(out, i)
                i += 1
            else:
                break
        return bytes(out)

    def _body_byte(self, out: bytearray, j: int) -> None:
        if self.frame_left == 0:
            self.len_bytes += out[j : j + 1]
            if len(self.len_bytes) == 3:
                self.frame_left = int.from_bytes(self.len_bytes, "big")
                self.len_bytes = b""
                self.flag_next = True
            return
        if self.flag_next:
            if self.frames == self.target:
                out[j] |= 0x10
            self.frames += 1
            self.flag_next = False
        self.frame_left -= 1


def server_port(server: Any) -> int:
    return int(server.url.rsplit(":", 1)[1].rstrip("/"))


@pytest.fixture
def client(s2_server: Any) -> Iterator[S2Client]:
    with S2Client(s2_config(s2_server.url, access_token=token(TOKEN))) as c:
        yield c


@pytest.fixture
def names(client: S2Client, unique: Callable[[str], str]) -> tuple[str, str]:
    basin, stream = unique("basin"), unique("stream")
    client.create_basin(basin)
    client.basin(basin).create_stream(stream)
    return basin, stream


@pytest.fixture
def stream(client: S2Client, names: tuple[str, str]) -> StreamClient:
    return client.basin(names[0]).stream(names[1])


@pytest.fixture
def proxy(s2_server: Any) -> Iterator[FaultProxy]:
    if not is_local(s2_server):
        pytest.fail(f"{LOCAL_ONLY} (a fault proxy in front)")
    p = FaultProxy(server_port(s2_server))
    yield p
    p.close()


def seqs(batches: list[Any]) -> list[int]:
    out: list[int] = []
    for b in batches:
        out.extend(b.batch.column("seq_num").to_pylist())
    return out


T0 = int(time.time() * 1000) - 3_600_000  # an hour ago: well within retention


def fill(stream: StreamClient, n: int, start: int = 0, size: int = 100) -> None:
    recs = [
        AppendRecord(f"{i:08d}".encode().ljust(size, b"."), timestamp=T0 + i)
        for i in range(start, start + n)
    ]
    stream.append_many(recs)


@pytest.mark.local_server  # a fault proxy in front of the local server
def test_sessions_reuse_a_kept_connection_and_replace_a_dead_one(
    stream: StreamClient, names: tuple[str, str], proxy: FaultProxy
) -> None:
    """A session's connection whose answer was read to its end serves the next session;
    one the server closed meanwhile is replaced before the request counts as failed (no
    retry, no backoff), and the records are exact either way."""
    fill(stream, 3000)
    with S2Client(S2Config(access_token=TOKEN, endpoint=proxy.url)) as c:
        basin = c.basin(names[0])
        for sever in (False, True):
            with pytest.raises(NotFoundError):
                list(basin.stream("missing").read_session(seq_num=0, count=5))
            before = proxy.accepted
            if sever:
                proxy.sever()
            session = basin.stream(names[1]).read_session(seq_num=7, count=2500)
            assert seqs(list(session)) == list(range(7, 2507))
            assert session.reconnects == 0
            assert proxy.accepted == before + sever  # a new connection only for a dead one


def test_session_count_and_bytes_bounds(stream: StreamClient) -> None:
    fill(stream, 3000)
    assert seqs(list(stream.read_session(seq_num=0, count=2500))) == list(range(2500))
    assert seqs(list(stream.read_session(seq_num=100, count=5))) == list(range(100, 105))
    # every record meters 8 + 100 = 108 bytes
    assert seqs(list(stream.read_session(seq_num=10, bytes=108 * 7 + 50))) == list(range(10, 17))
    assert seqs(list(stream.read_session(timestamp=T0 + 2990, count=20))) == list(range(2990, 3000))
    assert seqs(list(stream.read_session(seq_num=0, until=T0 + 5))) == [0, 1, 2, 3, 4]
    assert seqs(list(stream.read_session(tail_offset=3, count=3))) == [2997, 2998, 2999]
    batches = list(stream.read_session(seq_num=0, count=3000, include_headers=False))
    assert all("headers" not in b.batch.schema.names for b in batches)
    assert sum(b.batch.num_rows for b in batches) == 3000


def test_session_past_tail_and_clamp(stream: StreamClient) -> None:
    fill(stream, 5)
    with pytest.raises(ReadPastTailError) as e:
        list(stream.read_session(seq_num=9, count=1))
    assert e.value.tail.seq_num == 5
    # clamp starts at the tail; with wait the session then ends after the idle budget
    assert seqs(list(stream.read_session(seq_num=9, clamp=True, wait=1))) == []


def test_bounded_session_at_tail_needs_wait(stream: StreamClient) -> None:
    # S2: a bounded read starting at the tail with no wait has nothing it may return.
    with pytest.raises(ReadPastTailError):
        next(stream.read_session(seq_num=0, count=3))
    fill(stream, 2)
    # Catching up to the tail before the bound ends a session that has no wait.
    assert seqs(list(stream.read_session(seq_num=0, count=3))) == [0, 1]


@pytest.mark.local_server  # heartbeats every 0.5 s; s2-lite's come 5-15 s apart
def test_heartbeats_then_live_records(stream: StreamClient) -> None:
    session = stream.read_session(seq_num=0, count=3, wait=30, heartbeats=True)
    with session:
        first = next(session)
        assert first.count == 0 and first.batch.num_rows == 0
        assert first.tail is not None and first.tail.seq_num == 0
        second = next(session)  # another heartbeat while idle
        assert second.count == 0
        stream.append([AppendRecord(b"a"), AppendRecord(b"b"), AppendRecord(b"c")])
        got: list[int] = []
        for batch in session:
            got.extend(batch.batch.column("seq_num").to_pylist())
        assert got == [0, 1, 2]
        assert session.next_seq_num == 3


def test_heartbeats_hidden_by_default(stream: StreamClient) -> None:
    session = stream.read_session(seq_num=0, count=2, wait=30)
    appended = threading.Timer(1.2, lambda: stream.append([AppendRecord(b"x")] * 2))
    appended.start()
    try:
        assert seqs(list(session)) == [0, 1]
    finally:
        appended.join()


def test_wait_ends_idle_session(stream: StreamClient) -> None:
    fill(stream, 4)
    assert seqs(list(stream.read_session(seq_num=0, wait=1))) == [0, 1, 2, 3]


def test_command_records_filtered_but_counted(stream: StreamClient) -> None:
    stream.append([AppendRecord(b"a")])
    stream.fence("tok")
    stream.append([AppendRecord(b"b")], fencing_token="tok")
    batches = list(stream.read_session(seq_num=0, count=3, include_command_records=False))
    assert seqs(batches) == [0, 2]


def test_close_ends_session(stream: StreamClient) -> None:
    fill(stream, 10)
    session = stream.read_session(seq_num=0)
    first = next(session)
    assert first.count == 10
    session.close()
    with pytest.raises(StopIteration):
        next(session)


@pytest.mark.local_server  # a fault proxy in front of the local server
def test_reconnect_after_sever_adjusts_count(
    client: S2Client, stream: StreamClient, proxy: FaultProxy
) -> None:
    fill(stream, 10)
    cfg = S2Config(
        access_token=TOKEN,
        endpoint=proxy.url,
        retry=RetryPolicy(initial_backoff=0.01, max_backoff=0.05),
    )
    with S2Client(cfg) as pc:
        s = pc.basin(stream.basin).stream(stream.name)
        session = s.read_session(seq_num=0, count=25, bytes=108 * 24, wait=30)
        got = seqs([next(session)])
        assert got == list(range(10))
        proxy.sever()
        fill(stream, 20, start=10)
        for batch in session:
            got.extend(batch.batch.column("seq_num").to_pylist())
    assert got == list(range(24))  # bytes bound (24 records) wins over count (25)
    assert session.reconnects >= 1
    resumed = [line for line in proxy.request_lines if "seq_num=10" in line]
    assert resumed, proxy.request_lines
    assert "count=15" in resumed[0] and f"bytes={108 * 14}" in resumed[0]


@pytest.mark.local_server  # a fault proxy in front of the local server
def test_dead_session_detected_and_resumed(stream: StreamClient, proxy: FaultProxy) -> None:
    fill(stream, 5)
    cfg = S2Config(
        endpoint=proxy.url,
        session_idle_timeout=1.5,
        retry=RetryPolicy(initial_backoff=0.01, max_backoff=0.05),
    )
    with S2Client(cfg) as pc:
        s = pc.basin(stream.basin).stream(stream.name)
        session = s.read_session(seq_num=0, count=8, wait=30)
        got = seqs([next(session)])
        assert got == [0, 1, 2, 3, 4]
        proxy.freeze()  # the live connection goes silent: no heartbeats arrive
        fill(stream, 3, start=5)
        for batch in session:
            got.extend(batch.batch.column("seq_num").to_pylist())
    assert got == list(range(8))
    assert session.reconnects >= 1


def test_token_not_leaked_by_session_errors(stream: StreamClient) -> None:
    session = stream.read_session(seq_num=99, count=1)
    with pytest.raises(ReadPastTailError) as e:
        next(session)
    assert TOKEN not in str(e.value) and TOKEN not in repr(session)


def proxied(proxy: FaultProxy, stream: StreamClient) -> tuple[S2Client, StreamClient]:
    cfg = S2Config(
        access_token=TOKEN,
        endpoint=proxy.url,
        retry=RetryPolicy(initial_backoff=0.01, max_backoff=0.05),
    )
    c = S2Client(cfg)
    return c, c.basin(stream.basin).stream(stream.name)


def bodies(stream: StreamClient) -> list[bytes]:
    out: list[bytes] = []
    for b in stream.read_session(seq_num=0, count=stream.check_tail().seq_num):
        out.extend(b.batch.column("body").to_pylist())
    return out


@pytest.mark.local_server  # a fault proxy in front of the local server
def test_lost_append_response_with_match_seq_num_is_verified(
    stream: StreamClient, proxy: FaultProxy
) -> None:
    c, s = proxied(proxy, stream)
    with c:
        s.append([AppendRecord(b"first")])
        proxy.drop_next_response.set()
        ack = s.append([AppendRecord(b"a"), AppendRecord(b"b")], match_seq_num=1)
        assert (ack.start.seq_num, ack.end.seq_num) == (1, 3)
        assert not proxy.drop_next_response.is_set()  # the fault did happen
    assert bodies(stream) == [b"first", b"a", b"b"]


@pytest.mark.local_server  # a fault proxy in front of the local server
def test_lost_append_response_without_condition_is_not_retried(
    stream: StreamClient, proxy: FaultProxy
) -> None:
    c, s = proxied(proxy, stream)
    with c:
        s.append([AppendRecord(b"first")])
        proxy.drop_next_response.set()
        with pytest.raises(UnavailableError, match="may or may not have been applied") as e:
            s.append([AppendRecord(b"once")])
        assert stream.name in str(e.value) and TOKEN not in str(e.value)
    assert bodies(stream) == [b"first", b"once"]  # landed exactly once


@pytest.mark.local_server  # a fault proxy in front of the local server
def test_append_many_resumes_after_lost_session_response(
    stream: StreamClient, proxy: FaultProxy
) -> None:
    records = [AppendRecord(f"{i}".encode()) for i in range(2500)]
    c, s = proxied(proxy, stream)
    with c:
        s.append([AppendRecord(b"first")])
        proxy.drop_next_response.set()
        ack = s.append_many(records, match_seq_num=1)
        assert (ack.start.seq_num, ack.end.seq_num) == (1, 2501)
        assert not proxy.drop_next_response.is_set()
        proxy.drop_next_response.set()
        with pytest.raises(UnavailableError, match="outcome of the next batch is unknown"):
            s.append_many(records[:1500])
    # The unconditioned run was not retried: it landed once or not at all, never twice.
    got = bodies(stream)
    expected = [b"first"] + [r.body for r in records]
    assert got in (expected, expected + [r.body for r in records[:1500]])


@pytest.mark.local_server  # a fault proxy in front of the local server
def test_reconnect_advised_is_honoured_without_costing_a_retry(
    stream: StreamClient, proxy: FaultProxy
) -> None:
    fill(stream, 2500)  # catch-up frames of 1000, 1000, 500 records
    cfg = S2Config(endpoint=proxy.url, retry=RetryPolicy(max_attempts=1))
    with S2Client(cfg) as c:
        proxy.advise_frame = 0  # the first frame says: reconnect after me
        session = c.basin(stream.basin).stream(stream.name).read_session(seq_num=0, count=2500)
        got = seqs(list(session))
    assert got == list(range(2500))
    assert session.reconnects == 1
    gets = [line for line in proxy.request_lines if line.startswith("GET ")]
    assert len(gets) == 2 and "seq_num=1000" in gets[1] and "count=1500" in gets[1]
