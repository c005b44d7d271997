"""Large request bodies through the HTTP client's connections: sent whole and in order
when the socket takes them a part at a time (they go to httpcore as views)."""

from __future__ import annotations

import os
import socket
import threading

from httpcore._backends.sync import SyncStream

from s2_spark._http._client import _VIEW_WRITES, _GrowingReads


def _received(sock: socket.socket, n: int, out: list[bytes]) -> None:
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    out.append(bytes(got))


def test_large_writes_arrive_whole_through_partial_sends() -> None:
    """A body far larger than the socket's send buffer (so sent in many partial sends,
    each from a view of the rest) arrives byte for byte, as do small ones before it."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    small, large = b"head", os.urandom(40 * _VIEW_WRITES + 123)
    out: list[bytes] = []
    reader = threading.Thread(target=_received, args=(theirs, len(small) + len(large), out))
    reader.start()
    try:
        stream = _GrowingReads(SyncStream(ours))
        stream.write(small, timeout=30)
        stream.write(large, timeout=30)
        reader.join(timeout=60)
    finally:
        ours.close()
        theirs.close()
    assert out == [small + large]
