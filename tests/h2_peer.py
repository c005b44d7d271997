"""A small HTTP/2 server for tests (h2c, prior knowledge) that misbehaves on purpose: each
connection it accepts follows the next of its `plans` (the last one repeats), which says
what it does with the first request on that connection:

- `"answer"`: a 200 whose JSON body names the path and the connection's number;
- `"goaway"`: GOAWAY with a last stream id below the request's (not processed), then close;
- `"refuse"`: RST_STREAM(REFUSED_STREAM) (not processed); later requests are answered;
- `"goaway-then-close"`: GOAWAY naming the request as processed, then close unanswered;
- `"goaway-then-answer"`: GOAWAY naming the request as processed, then the answer, then
  close (a graceful shutdown, RFC 9113 6.8);
- `"silent"`: no answer to any request on that connection;
- `"elaborate"`: every answer the long way: a 103 first, a head of more than one frame
  (HEADERS, then CONTINUATION: a header `x-big` of 20,000 bytes), the body in padded
  DATA frames of 7 bytes, then trailers.

Every request it receives is recorded in `seen` as (connection number, stream id, path).
The GOAWAY frames are written by hand (hyperframe): h2 itself takes no more frames once it
has sent one, so it could not answer afterwards as a graceful shutdown does.
"""

from __future__ import annotations

import json
import socket
import threading
from types import TracebackType

import h2.config
import h2.connection
import h2.errors
import h2.events
from hyperframe.frame import GoAwayFrame

__all__ = ["H2Peer"]

_CONFIG = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")


class H2Peer:
    """The server on a free loopback port; `url` is its base URL. `with H2Peer(...)`
    closes it."""

    def __init__(self, plans: list[str]) -> None:
        self._plans = plans
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.seen: list[tuple[int, int, str]] = []
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._socks)

    def __enter__(self) -> H2Peer:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes `accept` (closing would not)
        self._listener.close()
        with self._lock:
            for sock in self._socks:
                sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._socks.append(sock)
                number = len(self._socks)
            plan = self._plans[min(number, len(self._plans)) - 1]
            thread = threading.Thread(target=self._serve, args=(sock, number, plan),
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket, number: int, plan: str) -> None:
        conn = h2.connection.H2Connection(config=_CONFIG)
        conn.initiate_connection()
        first = True
        try:
            sock.sendall(conn.data_to_send())
            while data := sock.recv(65536):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        path = dict(event.headers)[":path"]
                        with self._lock:
                            self.seen.append((number, event.stream_id, path))
                        follow = plan if plan in ("silent", "elaborate") else "answer"
                        if not self._act(sock, conn, event.stream_id, path, number,
                                         plan if first else follow):
                            _hang_up(sock)
                            return
                        first = False
                sock.sendall(conn.data_to_send())
        except OSError:
            pass  # closed by the client, or by `close`
        finally:
            sock.close()

    def _act(self, sock: socket.socket, conn: h2.connection.H2Connection, sid: int,
             path: str, number: int, plan: str) -> bool:
        """Do what `plan` says with stream `sid`; False: the connection is done."""
        if plan == "refuse":
            conn.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return True
        if plan == "silent":
            return True
        if plan == "elaborate":
            self._elaborate(conn, sid, path, number)
            return True
        if plan.startswith("goaway"):
            last = sid - 2 if plan == "goaway" else sid
            sock.sendall(conn.data_to_send()
                         + GoAwayFrame(0, last_stream_id=max(0, last)).serialize())
            if plan != "goaway-then-answer":
                return False
        body = json.dumps({"path": path, "connection": number}).encode()
        conn.send_headers(sid, [(":status", "200"), ("content-type", "application/json"),
                                ("content-length", str(len(body)))])
        conn.send_data(sid, body, end_stream=True)
        if plan == "goaway-then-answer":
            sock.sendall(conn.data_to_send())
            return False
        return True


    @staticmethod
    def _elaborate(conn: h2.connection.H2Connection, sid: int, path: str,
                   number: int) -> None:
        body = json.dumps({"path": path, "connection": number}).encode()
        conn.send_headers(sid, [(":status", "103"), ("link", "</x>; rel=preload")])
        conn.send_headers(sid, [(":status", "200"), ("content-type", "application/json"),
                                ("x-big", "b" * 20000)])
        for at in range(0, len(body), 7):
            conn.send_data(sid, body[at:at + 7], pad_length=5)
        conn.send_headers(sid, [("x-trailer", "t")], end_stream=True)


def _hang_up(sock: socket.socket) -> None:
    """Close after what was sent is read: end the sending side and wait for the client
    to close (closing with unread bytes would reset the connection, and the client might
    never read the GOAWAY)."""
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(10.0)
    while sock.recv(65536):
        pass
