"""An HTTP proxy for tests, as corporate networks have them: CONNECT tunnels for https://
URLs, absolute-form requests for http:// URLs. It records every request line it was sent,
so a test can prove that a client went through it.

Each absolute-form request is forwarded on a fresh upstream connection with
`Connection: close`, and the client's connection ends with the response: simple, and
correct for any client (it opens a new connection for the next request).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit

__all__ = ["HttpProxy", "read_head"]


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """The request head (up to the blank line) and what arrived after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the client closed before sending a request head")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


class HttpProxy:
    """A proxy on 127.0.0.1; `url` is what HTTPS_PROXY / HTTP_PROXY take."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.request_lines: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                head, rest = read_head(conn)
            except (OSError, ConnectionError):
                return
            line, *header_lines = head.decode("latin-1").split("\r\n")
            with self._lock:
                self.request_lines.append(line)
            method, target, version = line.split(" ", 2)
            if method == "CONNECT":
                self._tunnel(conn, target, rest)
            else:
                self._forward(conn, method, target, version, header_lines, rest)

    def _tunnel(self, conn: socket.socket, target: str, rest: bytes) -> None:
        host, _, port = target.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port))) as up:
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if rest:
                up.sendall(rest)
            back = threading.Thread(target=_pipe, args=(up, conn), daemon=True)
            back.start()
            _pipe(conn, up)
            back.join(30)

    def _forward(self, conn: socket.socket, method: str, target: str, version: str,
                 header_lines: list[str], rest: bytes) -> None:
        url = urlsplit(target)
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        kept = [h for h in header_lines
                if h.split(":", 1)[0].strip().lower() not in ("connection", "proxy-connection")]
        length = next((int(h.split(":", 1)[1]) for h in kept
                       if h.split(":", 1)[0].strip().lower() == "content-length"), 0)
        body = rest
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk
        head = "\r\n".join([f"{method} {path} {version}", *kept, "Connection: close", "", ""])
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80)) as up:
            up.sendall(head.encode("latin-1") + body)
            _pipe(up, conn)
