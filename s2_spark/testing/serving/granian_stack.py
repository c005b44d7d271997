"""The local server's fast HTTP stack: granian (Rust: hyper and tokio) in front of the ASGI
app, on the caller's event loop.

hyper parses HTTP/1.1 and HTTP/2 (h2c with prior knowledge on the same port; over TLS,
HTTP/2 or HTTP/1.1 by ALPN, client certificates if asked) on a tokio thread and hands each
request to the app on this event loop, so a request costs the app's own work and one
hand-over instead of a Python HTTP parser's: about a third of hypercorn's CPU per unary
request, and far less for HTTP/2 (`benchmarks/server.py`).

granian's embedded server (`granian.server.embed`) binds a port of its own; the local
server listens first (port 0 is resolved before the app runs), so this drives granian's
worker on that socket directly, through names granian does not document. They are
checked at import (`available`), and the `server` extra pins the versions they were
checked on; anything else falls back to hypercorn (`serving.stack`).
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from s2_spark.testing.serving.endpoint import LISTEN_BACKLOG, ServerTls

__all__ = ["H2_MAX_CONCURRENT_STREAMS", "H2_MAX_HEADER_LIST", "available", "serve"]

#: As hypercorn was configured: the tail watch sizes its HTTP/2 connections from it.
H2_MAX_CONCURRENT_STREAMS = 1000
#: Requests in flight at once before granian stops reading new ones (its default is the
#: listen backlog): a watch keeps one long-poll waiting per stream, 100,000 and more.
BACKPRESSURE = 1 << 22
#: Frames and bodies as large as hypercorn took (S2S frames are up to 2 MiB).
MAX_FRAME = 1024 * 1024
#: hyper's HTTP/1.1 read buffer, a body read in pieces of a frame: also the longest request
#: head (431 past it).
H1_READ_BUFFER = MAX_FRAME + 64 * 1024
#: The largest HTTP/2 header list taken (SETTINGS_MAX_HEADER_LIST_SIZE): s2-lite's.
H2_MAX_HEADER_LIST = 16 * 1024
#: hyper closes a connection whose request headers do not arrive within this (an idle
#: keep-alive connection included); its longest, as near hypercorn's 75 s as it goes.
HEADER_READ_TIMEOUT_MS = 60_000

_App = Any  # an ASGI callable: (scope, receive, send) -> awaitable


#: The granian versions whose worker this drives (the `server` extra pins the same).
CHECKED_VERSIONS = "2.8."


def available() -> str | None:
    """None when granian's worker can be driven here; else why not (for the log)."""
    try:
        import granian
        from granian._futures import _new_cbscheduler  # noqa: F401
        from granian._granian import ASGIWorker, SocketHolder, WorkerSignal  # noqa: F401
        from granian.http import HTTP1Settings, HTTP2Settings  # noqa: F401
    except ImportError as e:
        return f"granian is not installed ({e})"
    if not granian.__version__.startswith(CHECKED_VERSIONS):
        return (f"granian {granian.__version__} is not a version this server was checked "
                f"on ({CHECKED_VERSIONS}x)")
    return None


def _ssl_args(tls: ServerTls | None) -> tuple[Any, ...]:
    """granian's TLS arguments: (enabled, cert, key, password, min protocol, CA, CRLs,
    verify clients). TLS 1.2 and up, as Python's default server context takes."""
    if tls is None:
        return (False, None, None, None, "tls1.2", None, [], False)
    ca = tls.client_ca_file
    return (True, os.path.abspath(tls.cert_file), os.path.abspath(tls.key_file), None, "tls1.2",
            None if ca is None else os.path.abspath(ca), [], ca is not None)


def _worker(sock: socket.socket, tls: ServerTls | None) -> Any:
    from granian import _granian
    from granian.http import HTTP1Settings, HTTP2Settings

    # Typed loosely: granian's stubs lag its compiled signatures (the IPC argument).
    worker_class: Any = _granian.ASGIWorker

    holder = _granian.SocketHolder(os.dup(sock.fileno()), False, LISTEN_BACKLOG)  # type: ignore[call-arg]
    h1 = HTTP1Settings(header_read_timeout=HEADER_READ_TIMEOUT_MS, keep_alive=True,
                       max_buffer_size=H1_READ_BUFFER)
    h2 = HTTP2Settings(max_concurrent_streams=H2_MAX_CONCURRENT_STREAMS,
                       max_frame_size=MAX_FRAME, initial_stream_window_size=MAX_FRAME,
                       initial_connection_window_size=4 * MAX_FRAME,
                       # granian's default, 16 MiB, let a header block without end hold
                       # 20 CONTINUATION frames of MAX_FRAME (RSS +28 MiB); this, 6.
                       max_headers_size=H2_MAX_HEADER_LIST)
    # (worker id, (listener spec, socket), IPC, runtime threads, runtime blocking threads,
    #  blocking threads, their idle timeout, backpressure, HTTP mode, HTTP/1 and HTTP/2
    #  settings, websockets, static files, *TLS, metrics)
    return worker_class(1, (None, holder), None, 1, 512, 1, 30, BACKPRESSURE, "auto", h1, h2,
                      False, None, *_ssl_args(tls), (None, None))


def _runner(app: _App) -> Any:
    """granian's callback: run the app on one request, telling granian how it ended (a
    request ended by shutdown or by its client leaving is no error to log)."""

    async def run(watcher: Any) -> None:
        proto = watcher.proto
        try:
            await app(watcher.scope, proto.receive, proto.send)
        except (asyncio.CancelledError, ConnectionError):
            pass
        except BaseException as exc:
            watcher.err(exc)
            return
        watcher.done()

    return run


async def serve(sock: socket.socket, app: _App, shutdown: asyncio.Event,
                tls: ServerTls | None) -> None:
    """Serve the ASGI `app` on the listening `sock` until `shutdown` is set, then stop
    accepting (the caller ends the requests still running)."""
    from granian import _futures
    from granian._granian import WorkerSignal

    new_scheduler: Any = _futures._new_cbscheduler
    loop = asyncio.get_running_loop()
    signal = WorkerSignal()
    worker = _worker(sock, tls)
    scheduler = new_scheduler(loop, _runner(app), impl_asyncio=True)
    worker.serve_async(scheduler, loop, signal)
    try:
        await shutdown.wait()
    finally:
        signal.set()
        # Let granian close the connections whose requests just ended before the loop
        # that runs their callbacks goes away.
        await asyncio.sleep(0.25)
