"""A server on a raw socket for tests of what a client does when the server misbehaves
on purpose: each connection (counted in `connections`) handled by a subclass's `serve` on
a thread of its own (`finished` once `serve` returned or the client left), all of them
sending at most `cap` bytes together (counted in `sent`) so a client that never stops
reading cannot keep a test running. `with RawServer(...)`
closes it."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["RawServer"]


class RawServer:
    def __init__(self, cap: int = 256 << 20) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.cap, self.sent, self.connections, self.finished = cap, 0, 0, 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def send_until_cap(self, conn: socket.socket, data: bytes) -> None:
        """Send `data` again and again until `cap` bytes went out or the client left."""
        while self.sent < self.cap:
            conn.sendall(data)
            self.sent += len(data)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with contextlib.suppress(OSError), conn:
                self.serve(conn)
        finally:
            self.finished += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the blocked accept(), which close alone does not
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(10)

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

