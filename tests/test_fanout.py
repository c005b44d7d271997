"""The client's fan-out (`s2_spark._http.Fanout`) against a small HTTP/1.1 server over a
real socket: every call gets its own answer, at most `limit` of a run are in flight and
at most `width` per origin in all, a follow-up goes out in the answered call's place, and
a call the server never answers times out on its own without holding up the others."""

from __future__ import annotations

import asyncio
import asyncio.trsock
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from _waiting import wait_for

from s2_spark._http import AsyncTimeouts, BodyTooLargeError, Call, Fanout, Response

TIMEOUTS = AsyncTimeouts(connect=5.0, read=30.0)


class SlowServer:
    """Answers `GET /<n>` with body `<n>` after `delay` s, one connection per thread, and
    counts the requests it is working on at once (`most`). `GET /never` is never
    answered, nor anything after it on its connection (HTTP/1.1 answers in order);
    `/bad` gets a malformed answer; `/close-<n>` its answer with `Connection: close`, then
    the connection ends (the requests after it on the connection never taken);
    `/hangup-<n>` its answer as if the connection stayed open, then the connection ends;
    a path with `tail-<n>` in it has S2's answer to a tail lookup, at seq_num n, time 10n."""

    def __init__(self, delay: float = 0.02) -> None:
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self.busy = self.most = self.connections = 0
        self.seen: list[str] = []  # paths taken, in order
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for sock in self._socks:
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._socks.append(sock)
                self.connections += 1
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                path = head.split(b" ")[1].decode()
                if path == "/never":
                    while sock.recv(65536):  # no answer, ever, until the client closes
                        pass
                    return
                with self._lock:
                    self.seen.append(path)
                    self.busy += 1
                    self.most = max(self.most, self.busy)
                time.sleep(self.delay)
                with self._lock:
                    self.busy -= 1
                body = path.lstrip("/").encode()
                if "tail-" in path:
                    n = int(path.rsplit("-", 1)[1])
                    body = b'{"tail":{"seq_num":%d,"timestamp":%d}}' % (n, 10 * n)
                if path == "/bad":
                    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n")
                    continue
                if path.startswith("/hangup-"):  # answered as if kept, then closed
                    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s"
                                 % (len(body), body))
                    sock.shutdown(socket.SHUT_WR)
                    while sock.recv(65536):
                        pass
                    return
                close = path.startswith("/close-")
                sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s"
                             % (len(body), b"connection: close\r\n" if close else b"", body))
                if close:  # as RFC 9112 9.6 asks: no more sent, what came read and dropped
                    sock.shutdown(socket.SHUT_WR)
                    while sock.recv(65536):
                        pass
                    return
        except OSError:
            return


@pytest.fixture
def server() -> Iterator[SlowServer]:
    s = SlowServer()
    yield s
    s.close()


def get(url: str, path: str) -> Call:
    return Call(b"GET", url, path, [])


def test_each_call_gets_its_own_answer_within_the_run_limit(server: SlowServer) -> None:
    with Fanout(ssl.create_default_context, TIMEOUTS, width=16) as fanout:
        results = fanout.run([get(server.url, f"/{k}") for k in range(60)], limit=5)
    assert [r.content for r in results if isinstance(r, Response)] == [
        str(k).encode() for k in range(60)]
    assert server.most == 5  # reached, never passed
    assert server.connections == 5


def test_the_width_bounds_calls_in_flight_per_origin(server: SlowServer) -> None:
    with Fanout(ssl.create_default_context, TIMEOUTS, width=4) as fanout:
        results = fanout.run([get(server.url, f"/{k}") for k in range(40)])
        again = fanout.run([get(server.url, f"/{k}") for k in range(8)])
    assert all(isinstance(r, Response) and r.status_code == 200 for r in results + again)
    assert server.most == 4
    assert server.connections == 4  # kept from one run to the next


def test_a_follow_up_goes_out_in_the_place_of_the_answered_call(server: SlowServer) -> None:
    def then(i: int, response: Response) -> Call | None:
        n = int(response.content)
        return get(server.url, f"/{n + 100}") if n < 100 else None

    with Fanout(ssl.create_default_context, TIMEOUTS, width=3) as fanout:
        results = fanout.run([get(server.url, f"/{k}") for k in range(10)], then=then)
    assert [r.content for r in results if isinstance(r, Response)] == [
        str(k + 100).encode() for k in range(10)]


def test_an_answer_past_its_call_s_max_body_is_that_call_s_error(server: SlowServer) -> None:
    """A call that expects a small answer says so: a longer one fails it (naming the
    limit) and the run goes on; the limit is the body's, to its last byte."""
    with Fanout(ssl.create_default_context, TIMEOUTS, width=2) as fanout:
        calls = [Call(b"GET", server.url, "/123456", [], max_body=5),
                 Call(b"GET", server.url, "/12345", [], max_body=5),
                 Call(b"GET", server.url, "/123456", [])]
        over, exact, default = fanout.run(calls)
    assert isinstance(over, BodyTooLargeError)  # the server's doing: never retried
    assert str(over) == "a body of 6 bytes, over 5 bytes (the most this request takes)"
    assert isinstance(exact, Response) and exact.content == b"12345"
    assert isinstance(default, Response) and default.content == b"123456"


def test_a_call_never_answered_times_out_without_holding_up_the_others(
    server: SlowServer,
) -> None:
    timeouts = AsyncTimeouts(connect=5.0, read=1.0)
    with Fanout(ssl.create_default_context, timeouts, width=4) as fanout:
        calls = [get(server.url, "/never"), *(get(server.url, f"/{k}") for k in range(20))]
        results = fanout.run(calls)
        assert isinstance(results[0], httpx.ReadTimeout)
        assert [r.content for r in results[1:] if isinstance(r, Response)] == [
            str(k).encode() for k in range(20)]
        # The connection that timed out was dropped; the fan-out goes on.
        assert [r.content for r in fanout.run([get(server.url, "/7")])
                if isinstance(r, Response)] == [b"7"]


def test_a_refused_connection_is_that_call_s_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with Fanout(ssl.create_default_context, TIMEOUTS) as fanout:
        results = fanout.run([get(url, "/1"), get(url, "/2")])
    assert all(isinstance(r, httpx.ConnectError) for r in results)


def test_many_calls_go_pipelined_on_few_connections_each_with_its_own_answer(
    server: SlowServer,
) -> None:
    server.delay = 0.0
    with Fanout(ssl.create_default_context, TIMEOUTS, width=2, depth=8) as fanout:
        results = fanout.run([get(server.url, f"/{k}") for k in range(200)])
    assert [r.content for r in results if isinstance(r, Response)] == [
        str(k).encode() for k in range(200)]
    assert server.connections == 2


def test_calls_queued_behind_an_answer_that_closes_the_connection_go_again(
    server: SlowServer,
) -> None:
    """The server takes none of the requests after a `Connection: close` answer on its
    connection: they go again on another, each answered once."""
    server.delay = 0.0
    paths = [f"/close-{k}" if k % 5 == 0 else f"/{k}" for k in range(30)]
    with Fanout(ssl.create_default_context, TIMEOUTS, width=1, depth=8) as fanout:
        results = fanout.run([get(server.url, p) for p in paths])
    assert [r.content for r in results if isinstance(r, Response)] == [
        p.lstrip("/").encode() for p in paths]
    assert sorted(server.seen) == sorted(paths)  # each taken once


def test_a_malformed_answer_fails_its_call_a_get_behind_it_goes_again_a_post_fails(
    server: SlowServer,
) -> None:
    """A POST behind a failed request may have been taken: it fails (its caller knows
    how to find out); a GET goes again."""
    server.delay = 0.0
    with Fanout(ssl.create_default_context, TIMEOUTS, width=1, depth=8) as fanout:
        bad, post, after = fanout.run([get(server.url, "/bad"),
                                       Call(b"POST", server.url, "/7", []),
                                       get(server.url, "/8")])
    assert isinstance(bad, httpx.RemoteProtocolError)
    assert isinstance(post, httpx.ReadError)
    assert str(post) == ("the connection was dropped after a malformed answer to an "
                         "earlier request")
    assert isinstance(after, Response) and after.content == b"8"


def _sound(fanout: Fanout) -> list[Any]:
    """The fan-out's connections that may carry requests (its own state, for a test)."""
    return [c for pool in fanout._pools.values() for c in pool.conns if c.sound]


def test_a_connection_the_server_closed_while_idle_is_replaced(server: SlowServer) -> None:
    """At the width, a connection closed while idle still makes room for a new one."""
    server.delay = 0.0
    with Fanout(ssl.create_default_context, TIMEOUTS, width=1) as fanout:
        [first] = fanout.run([get(server.url, "/hangup-1")])
        wait_for(lambda: not _sound(fanout), "the client to see the close")
        results = fanout.run([get(server.url, "/2"), get(server.url, "/3")])
    assert isinstance(first, Response) and first.content == b"hangup-1"
    assert [r.content for r in results if isinstance(r, Response)] == [b"2", b"3"]
    assert server.connections == 2


# -- tail lookups in bulk (`Fanout.run_tails`) ------------------------------------------


def _tails(run: Any) -> list[Any]:
    """Each request's outcome: its position, or its answer's body, or its error's type."""
    return [(run.seqs[i], run.tss[i]) if i not in run.others
            else run.others[i].content if isinstance(run.others[i], Response)
            else type(run.others[i]).__name__ for i in range(len(run.seqs))]


def test_tail_lookups_in_bulk_are_read_into_arrays_on_few_connections(
    server: SlowServer,
) -> None:
    server.delay = 0.0
    with Fanout(ssl.create_default_context, TIMEOUTS, width=2, depth=8) as fanout:
        run = fanout.run_tails(server.url, [b"/tail-%d" % k for k in range(300)], [], 1024)
        again = fanout.run_tails(server.url, [b"/tail-%d" % k for k in range(5)], [], 1024)
    assert _tails(run) == [(k, 10 * k) for k in range(300)]
    assert _tails(again) == [(k, 10 * k) for k in range(5)]
    assert server.connections == 2  # kept from one run to the next


def test_bulk_answers_of_another_kind_are_kept_and_what_follows_goes_again(
    server: SlowServer,
) -> None:
    """An answer of another kind (one that closes the connection, too) is kept as it came
    (a body past the limit as its error), a malformed one fails its request, and the
    requests behind an answer that closed the connection, or behind a failed one, go
    again (GETs: one the server took already is taken again), each answered in its place."""
    server.delay = 0.0
    paths = [b"/tail-1", b"/7", b"/close-tail-2", b"/tail-3", b"/bad", b"/tail-4",
             b"/" + b"9" * 65, b"/tail-5", *(b"/tail-%d" % k for k in range(7, 40)),
             b"/hangup-tail-6"]
    with Fanout(ssl.create_default_context, TIMEOUTS, width=1, depth=8) as fanout:
        run = fanout.run_tails(server.url, paths, [], 64)
    assert _tails(run) == [(1, 10), b"7", b'{"tail":{"seq_num":2,"timestamp":20}}', (3, 30),
                           "RemoteProtocolError", (4, 40),
                           "BodyTooLargeError", (5, 50), *((k, 10 * k) for k in range(7, 40)),
                           (6, 60)]
    assert set(server.seen) == {p.decode() for p in paths}


def test_a_bulk_lookup_never_answered_times_out_and_the_others_go_on(
    server: SlowServer,
) -> None:
    timeouts = AsyncTimeouts(connect=5.0, read=1.0)
    with Fanout(ssl.create_default_context, timeouts, width=2, depth=4) as fanout:
        run = fanout.run_tails(server.url, [b"/never", *(b"/tail-%d" % k for k in range(20))],
                               [], 1024)
    assert _tails(run) == ["ReadTimeout", *((k, 10 * k) for k in range(20))]


def test_bulk_lookups_on_a_refused_connection_are_each_its_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with Fanout(ssl.create_default_context, TIMEOUTS) as fanout:
        run = fanout.run_tails(url, [b"/tail-1", b"/tail-2"], [], 1024)
    assert _tails(run) == ["ConnectError", "ConnectError"]


QUICKACK = getattr(socket, "TCP_QUICKACK", None)


def _fifty_answered(fanout: Fanout, url: str, bulk: bool) -> None:
    """50 pipelined requests (tail lookups in bulk, or plain GETs), each answered."""
    if bulk:
        got = _tails(fanout.run_tails(url, [b"/tail-%d" % k for k in range(50)], [], 1024))
        assert got == [(k, 10 * k) for k in range(50)]
    else:
        results = fanout.run([get(url, f"/{k}") for k in range(50)])
        assert [r.content for r in results if isinstance(r, Response)] == [
            str(k).encode() for k in range(50)]


@pytest.mark.skipif(QUICKACK is None, reason="TCP_QUICKACK is Linux's")
@pytest.mark.parametrize("bulk", [False, True])
def test_answers_due_are_acknowledged_at_once(
    server: SlowServer, monkeypatch: pytest.MonkeyPatch, bulk: bool,
) -> None:
    """A server with Nagle's algorithm on holds a pipeline's next answer until the one
    before is acknowledged: a connection with answers due asks for quick acks (a delayed
    one costs 40 ms a window of pipelined requests, issue 54)."""
    asked: list[tuple[int, int, int]] = []
    original = asyncio.trsock.TransportSocket.setsockopt

    def setsockopt(self: Any, level: int, option: int, value: int) -> None:
        asked.append((level, option, value))
        original(self, level, option, value)

    monkeypatch.setattr(asyncio.trsock.TransportSocket, "setsockopt", setsockopt)
    server.delay = 0.0
    with Fanout(ssl.create_default_context, TIMEOUTS, width=2, depth=8) as fanout:
        _fifty_answered(fanout, server.url, bulk)
    assert (socket.IPPROTO_TCP, QUICKACK, 1) in asked


@pytest.mark.parametrize("bulk", [False, True])
def test_a_socket_that_takes_no_quick_ack_still_gets_its_answers(
    server: SlowServer, monkeypatch: pytest.MonkeyPatch, bulk: bool,
) -> None:
    """Asking for quick acks is a hint: a socket that refuses it is asked no more."""
    asked: list[int] = []

    def refuse(self: Any, level: int, option: int, value: int) -> None:
        asked.append(option)
        raise OSError("not here")

    monkeypatch.setattr(asyncio.trsock.TransportSocket, "setsockopt", refuse)
    server.delay = 0.0
    with Fanout(ssl.create_default_context, TIMEOUTS, width=1, depth=8) as fanout:
        _fifty_answered(fanout, server.url, bulk)
    assert len(asked) <= 1  # once on the one connection, if at all
