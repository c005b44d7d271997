"""A TCP proxy that holds every byte for a while, so a local server answers as far away as
a real service: for benchmarks of round-trip-bound work (many small requests).

Put it between a client and a server and point the client at `proxy.url`: each chunk is
forwarded `rtt_ms / 2` milliseconds after it arrived, in each direction, in order, so a
request and its answer take `rtt_ms` longer than on loopback, while bandwidth is not
limited. One asyncio thread carries every connection (thousands of them are cheap).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from urllib.parse import urlsplit

from s2_spark._closeable import Closeable

__all__ = ["DelayProxy"]

_CHUNK = 65536


class DelayProxy(Closeable):
    """Forwards `host:port` (`url`) to the server at `upstream` (a URL or "host:port"),
    `rtt_ms` later, from construction until `close()` (or the end of a `with` block)."""

    def __init__(self, upstream: str, *, rtt_ms: float, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        parts = urlsplit(upstream if "://" in upstream else f"tcp://{upstream}")
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must name a host and a port (got {upstream!r})")
        if not rtt_ms >= 0:
            raise ValueError(f"rtt_ms must be >= 0 (got {rtt_ms!r})")
        self._upstream = (parts.hostname, parts.port)
        self._scheme = parts.scheme if parts.scheme in ("http", "https") else "http"
        self._delay = rtt_ms / 2000.0
        self.rtt_ms = rtt_ms
        self.host = host
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        listener = socket.create_server((host, port))
        self.port: int = listener.getsockname()[1]
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(listener, started),
                                        name="delay-proxy", daemon=True)
        self._thread.start()
        started.wait()

    def __repr__(self) -> str:
        return f"DelayProxy({self.url!r} -> {self._upstream}, rtt_ms={self.rtt_ms})"

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}"

    def close(self) -> None:
        if not self._loop.is_closed() and self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    async def _shut(self) -> None:
        """Stop accepting, close every connection, and let their pipes end."""
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.close()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5)

    def _run(self, listener: socket.socket, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connected, sock=listener))
        started.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _connected(self, down_r: asyncio.StreamReader,
                         down_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.add(down_w)
        writers = [down_w]
        try:
            up_r, up_w = await asyncio.open_connection(*self._upstream)
            writers.append(up_w)
            self._writers.add(up_w)
            self.connections += 1
            for w in writers:
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.gather(self._pipe(down_r, up_w), self._pipe(up_r, down_w),
                                 return_exceptions=True)
        except OSError:
            pass  # the upstream refused: the client sees its connection closed
        finally:
            for w in writers:
                w.close()
                self._writers.discard(w)
            self._handlers.discard(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Forward `src` to `dst`, each chunk `_delay` seconds after it arrived."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def send() -> None:
            while (item := await held.get()) is not None:
                due, data = item
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                dst.write(data)
                await dst.drain()
            with contextlib.suppress(OSError):
                dst.write_eof()

        sender = asyncio.ensure_future(send())
        try:
            while data := await src.read(_CHUNK):
                held.put_nowait((loop.time() + self._delay, data))
        except (OSError, RuntimeError):  # reset, or closed by `close`
            pass
        finally:
            held.put_nowait(None)
            with contextlib.suppress(OSError):
                await sender
