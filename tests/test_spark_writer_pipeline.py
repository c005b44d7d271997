"""Pipelined exactly-once appends: chains of marked appends in one S2S session.

Real appends against the local server. A TCP proxy in front of it stops one session
request part way (`SessionGate`): held while another attempt bumps the stream, dropped,
or sent whole with its response withheld. Every test reads back exact records.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_s2_sink import PER, bodies, data_rows, wid

from s2_spark.backends.s2.sink import SinkSettings, StreamSink
from s2_spark.errors import FencingTokenMismatchError, WriterFencedError
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.wire.appends import encode_records

DEADLINE = 30.0
#: One flush of 5 full appends (998 rows + mark + token each), sent as one chain.
CHAIN = SinkSettings(flush_records=5 * PER)


def wait_until(what: str, cond: Callable[[], bool]) -> None:
    end = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class SessionGate:
    """A TCP proxy to the server that stops the first S2S append request it sees after
    `fraction` of its body: "hold" forwards the rest once `release` is set, "drop" closes
    both sides there, "mute" forwards the whole request but no response and closes the
    client's connection once `release` is set. Later requests pass through."""

    def __init__(self, upstream: str, mode: str, fraction: float = 0.5) -> None:
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.mode = mode
        self.fraction = fraction
        self.release = threading.Event()
        self.triggered = threading.Event()
        self._armed = True
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            muted = threading.Event()
            threading.Thread(target=self._up, args=(client, server, muted), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, muted), daemon=True).start()

    def _cut_at(self, buf: bytes) -> int | None:
        """Where to stop in `buf` (all bytes of this connection so far), if it holds the
        session request's headers and this gate is still armed."""
        at = buf.lower().find(b"content-type: s2s/proto")
        end = buf.find(b"\r\n\r\n", at)
        if at < 0 or end < 0:
            return None
        head = buf[:end].lower()
        length = int(head[head.rfind(b"content-length:") + 15:].split(b"\r\n")[0])
        with self._lock:
            if not self._armed:
                return None
            self._armed = False
        return end + 4 + int(length * self.fraction)

    def _up(self, client: socket.socket, server: socket.socket, muted: threading.Event) -> None:
        buf, sent, cut = b"", 0, None
        try:
            while data := client.recv(65536):
                buf += data
                if cut is None and not self.triggered.is_set():
                    cut = self._cut_at(buf)
                    if cut is not None and self.mode == "mute":
                        muted.set()
                limit = len(buf) if cut is None or self.mode == "mute" else min(cut, len(buf))
                server.sendall(buf[sent:limit])
                sent = limit
                if cut is not None and sent >= cut:
                    if not self._act(client, server, buf, sent):
                        return
                    cut, sent = None, len(buf)
        except OSError:
            pass
        finally:
            _close(server)

    def _act(self, client: socket.socket, server: socket.socket, buf: bytes,
             sent: int) -> bool:
        """Stop the request at the cut; whether the connection goes on."""
        self.triggered.set()
        if self.mode == "drop":
            _close(client)
            return False
        assert self.release.wait(DEADLINE), "the test never released the gate"
        if self.mode == "mute":
            _close(client)
            return False
        server.sendall(buf[sent:])  # "hold": the rest, then pass everything through
        return True

    def _down(self, server: socket.socket, client: socket.socket, muted: threading.Event) -> None:
        try:
            while data := server.recv(65536):
                if not muted.is_set():
                    client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def env(s2_server: Any, unique: Callable[[str], str]) -> Iterator[tuple[Any, Any, str]]:
    """(a client's basin, the basin's name, a new stream in it, empty but for the fence
    record setting the test writers' run token: as a run leaves a stream it writes)."""
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        name = unique("pipebasin")
        client.create_basin(name)
        stream = unique("s")
        client.basin(name).create_stream(stream)
        client.basin(name).stream(stream).fence(wid().run_token())
        yield client.basin(name), name, stream


def gated(s2_server: Any, mode: str) -> tuple[SessionGate, S2Client]:
    gate = SessionGate(s2_server.url, mode)
    return gate, S2Client(S2Config(endpoint=gate.url))


def expect(n: int) -> list[bytes]:
    return [f"r{i}".encode() for i in range(n)]


def test_chain_stops_at_the_first_failed_condition(env: tuple[Any, str, str]) -> None:
    """The client: input 2 of 4 names a wrong token, so inputs 2 and 3 never land."""
    basin, _, first = env
    name = f"{first}-plain"
    basin.create_stream(name)
    stream = basin.stream(name)
    batches = [encode_records([(f"c{k}".encode(), [], None)])[0] for k in range(4)]
    fences = [encode_records([AppendRecord.fence(f"t{k}")])[0] for k in range(4)]
    from s2_spark.wire.appends import AppendBatch

    chained = [AppendBatch(b.records_payload + f.records_payload, 2, 0, 0)
               for b, f in zip(batches, fences, strict=True)]
    res = stream.append_chain(chained, fencing_tokens=["", "t0", "wrong", "t2"],
                              match_seq_num=0)
    assert [(a.start.seq_num, a.end.seq_num) for a in res.acks] == [(0, 2), (2, 4)]
    assert isinstance(res.error, FencingTokenMismatchError)
    assert res.error.expected_token == "t1"
    assert [b for b, _ in data_rows(basin, name)] == [b"c0", b"c1"]
    with pytest.raises(ValueError, match="one fencing token per input"):
        stream.append_chain(chained, fencing_tokens=["", "t0"])


def test_chain_all_acked(env: tuple[Any, str, str]) -> None:
    """No faults: 5 full appends go out as one chain; every count and the tail add up."""
    basin, _, name = env
    sink = StreamSink(basin, name, wid(), CHAIN)
    sink.add(bodies(5000))
    assert (sink.appends, sink.appended) == (5, 5 * PER)
    result = sink.close()
    assert (result.appended, result.appends, result.first_seq_num) == (5000, 6, 1)
    assert [b for b, _ in data_rows(basin, name)] == expect(5000)
    # 6 data appends, each ending with a mark and the token
    assert basin.stream(name).check_tail().seq_num == 1 + 5000 + 12


def test_takeover_mid_chain_leaves_exactly_the_prefix(
    s2_server: Any, env: tuple[Any, str, str]
) -> None:
    """A newer attempt bumps the stream after inputs 0 and 1 of the zombie's chain have
    landed and before the rest arrive: the rest fail their condition, the zombie finds
    the newer attempt's mark and stops with WriterFencedError, and the newer attempt
    resumes right after the prefix."""
    basin, basin_name, name = env
    gate, client = gated(s2_server, "hold")
    zombie = StreamSink(client.basin(basin_name), name, wid(), CHAIN)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            zombie.add(bodies(5000))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    try:
        t.start()
        wait_until("the chain's first half", gate.triggered.is_set)
        tail = basin.stream(name).check_tail
        wait_until("inputs 0 and 1 to land", lambda: tail().seq_num == 1 + 2 * 1000)
        newer = StreamSink(basin, name, wid(attempt=1), CHAIN)
        newer.add(bodies(5000))
        result = newer.close()
        gate.release.set()
        t.join(DEADLINE)
    finally:
        gate.close()
        client.close()
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], WriterFencedError), errors
    assert (zombie.appends, zombie.appended) == (2, 2 * PER)
    assert (result.skipped, result.appended) == (2 * PER, 5000 - 2 * PER)
    assert [b for b, _ in data_rows(basin, name)] == expect(5000)


@pytest.mark.parametrize("mode", ["drop", "mute"])
def test_cut_session_is_settled_by_the_marks(
    s2_server: Any, env: tuple[Any, str, str], mode: str
) -> None:
    """The connection dies mid-session, "drop": half way through the request (a prefix
    landed, no ack came), "mute": after all of it landed, with no ack delivered. The
    writer bumps (so nothing of the lost session can land later) and its marks up to the
    bump say which appends landed; only the others are sent again."""
    basin, basin_name, name = env
    gate, client = gated(s2_server, mode)
    tail = basin.stream(name).check_tail
    if mode == "mute":
        def release_when_all_landed() -> None:
            wait_until("the chain to land", lambda: tail().seq_num == 1 + 5 * (PER + 2))
            gate.release.set()

        threading.Thread(target=release_when_all_landed, daemon=True).start()
    try:
        sink = StreamSink(client.basin(basin_name), name, wid(), CHAIN)
        sink.add(bodies(5000))
        assert gate.triggered.is_set()
        assert sink.appended == 5 * PER
        result = sink.close()
    finally:
        gate.close()
        client.close()
    assert (result.appended, result.skipped) == (5000, 0)
    assert [b for b, _ in data_rows(basin, name)] == expect(5000)
    assert tail().seq_num == 1 + 5000 + 6 * 2 + 2  # every append once, and the bump


def test_inflight_bounds_split_chains(env: tuple[Any, str, str]) -> None:
    """At most `max_inflight_appends` / `max_inflight_bytes` per session; order kept."""
    basin, _, first = env
    bounds = {2: SinkSettings(flush_records=5 * PER, max_inflight_appends=2),
              1: SinkSettings(flush_records=5 * PER, max_inflight_bytes=1)}
    for most, settings in bounds.items():
        name = f"{first}-{most}"
        basin.create_stream(name)
        basin.stream(name).fence(wid().run_token())
        sink = StreamSink(basin, name, wid(), settings)
        chains: list[int] = []
        send = sink._stream.append_chain

        def spy(batches: Any, chains: list[int] = chains, send: Any = send, **kw: Any) -> Any:
            chains.append(len(batches))
            return send(batches, **kw)

        sink._stream.append_chain = spy  # type: ignore[method-assign]
        sink.add(bodies(5000))
        sink.close()
        assert chains == [most] * (5 // most) + [5 % most] * (5 % most > 0) + [1], chains
        assert [b for b, _ in data_rows(basin, name)] == expect(5000)


def test_arrow_slices_are_appended_once(env: tuple[Any, str, str]) -> None:
    """Many small chunks in, pipelined out: the same rows in the same order."""
    basin, _, name = env
    sink = StreamSink(basin, name, wid(), SinkSettings(flush_records=3000))
    arr = bodies(20000)
    for i in range(0, 20000, 777):
        sink.add(arr.slice(i, 777))
    assert sink.close().appended == 20000
    assert [b for b, _ in data_rows(basin, name)] == arr.to_pylist()


def test_appends_in_flight_option() -> None:
    """The writer option `maxAppendsInFlight` sets the bound; out of range is named."""
    from s2_spark.spark.options import OptionError
    from s2_spark.spark.s2._writer_options import parse_write_options

    base = {"endpoint": "http://127.0.0.1:1", "basin": "b", "stream": "s"}
    assert parse_write_options(base).sink.max_inflight_appends == 64
    assert parse_write_options({**base, "maxAppendsInFlight": "3"}).sink.max_inflight_appends == 3
    with pytest.raises(OptionError, match=r"maxAppendsInFlight=257 .* 1\.\.256"):
        parse_write_options({**base, "maxAppendsInFlight": "257"})
