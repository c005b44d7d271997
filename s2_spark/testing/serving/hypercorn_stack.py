"""The local server's fallback HTTP stack: hypercorn (pure Python: h11, h2, asyncio) in
front of the ASGI app, on the caller's event loop.

Used where granian is not installed (`serving.stack`). It serves everything the fast
stack does (HTTP/1.1 and h2c on one port, TLS with ALPN and client certificates) at
about three times its CPU per request.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from typing import Any

from s2_spark.testing.serving.endpoint import LISTEN_BACKLOG, ServerTls

__all__ = ["available", "serve"]

#: h11's bound on a request head (431 past it).
H1_MAX_HEAD = 1024 * 1024
#: python-h2's bound on an HTTP/2 header list, the only one it enforces: hypercorn sets
#: its SETTINGS in a way that never reaches the decoder (0.18), so it keeps its default.
H2_MAX_HEADER_LIST = 64 * 1024


def available() -> str | None:
    """None when hypercorn can serve here; else why not."""
    try:
        import hypercorn.asyncio  # noqa: F401
    except ImportError as e:
        return f"hypercorn is not installed ({e})"
    return None


def _config(fd: int, tls: ServerTls | None) -> Any:
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{fd}"]
    if tls is not None:
        config.certfile, config.keyfile = tls.cert_file, tls.key_file
        if tls.client_ca_file is not None:
            config.ca_certs = tls.client_ca_file
            config.verify_mode = ssl.CERT_REQUIRED
    config.accesslog = None
    config.errorlog = logging.getLogger("s2_spark.testing.server")
    config.graceful_timeout = 1.0
    config.keep_alive_timeout = 75.0
    config.h2_max_concurrent_streams = 1000
    # Like S2, no cap on a connection's requests: hypercorn's default (1000) closed HTTP/2
    # connections under hundreds of waiting long-polls, failing them all.
    config.keep_alive_max_requests = 2**62
    # The listen queue `listen` asked for (hypercorn listens again with its own, 100: a
    # watch connecting many streams at once saw SYNs dropped and connects time out).
    config.backlog = LISTEN_BACKLOG
    config.h2_max_inbound_frame_size = 1024 * 1024
    config.h11_max_incomplete_size = H1_MAX_HEAD
    config.h2_max_header_list_size = H2_MAX_HEADER_LIST  # advertised as it is enforced
    config.include_server_header = False
    return config


def _short_tls_shutdown(loop: asyncio.AbstractEventLoop) -> None:
    """Make this loop's TLS servers give up on a closing handshake after 1 s, not asyncio's
    30 s: pooled client connections (a Spark worker's) never answer it, and stopping the
    server would wait that long for each. hypercorn passes no such setting itself."""
    create_server = loop.create_server

    async def with_short_shutdown(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_shutdown_timeout", 1.0)
        return await create_server(*args, **kwargs)

    loop.create_server = with_short_shutdown  # type: ignore[method-assign]


def _tolerate_data_after_response() -> None:
    """Patch hypercorn's HTTP/2 protocol to end, not crash on, DATA for streams it already
    closed.

    When the server answers a request before its body ended (a 403/404 to an S2S append
    session, a 400 to a body too large), the client may still be sending DATA. hypercorn
    0.18 closes the stream once the response ends and then raises KeyError on that DATA,
    killing the whole connection (every other stream on it, e.g. s2-sdk's read sessions,
    dies too). Hand such frames' flow-control credit back and reset the stream with
    NO_ERROR, as RFC 9113 section 8.1 allows and hyper (granian, s2-lite) does: the client
    stops sending, where crediting alone would take a body without end forever.
    """
    import h2.events
    from hypercorn.protocol.h2 import H2Protocol

    original = H2Protocol._handle_events
    if getattr(original, "_s2_tolerant", False):
        return

    async def handle_events(self: Any, events: list[Any]) -> None:
        # One event at a time: a RequestReceived earlier in the list opens its stream.
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                self.connection.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id
                )
                stream = self.connection.streams.get(event.stream_id)
                if stream is not None and not stream.closed:
                    self.connection.reset_stream(event.stream_id)  # NO_ERROR
                await original(self, [])  # flush the WINDOW_UPDATE and RST_STREAM
            else:
                await original(self, [event])

    handle_events._s2_tolerant = True  # type: ignore[attr-defined]
    H2Protocol._handle_events = handle_events  # type: ignore[method-assign]


def _drop_body_after_answer() -> None:
    """Patch hypercorn's HTTP streams to drop what a client still sends once its answer
    went out.

    hypercorn 0.18 hands each piece of a body to the app through a queue of 10 and waits
    while it is full. An app that answered without reading a long body (a 415, a body
    too large) left that wait blocked for good, and with it the disconnect hypercorn
    queues when the answer ends the stream: the connection was neither read nor closed,
    and outlived its client (measured: ~0.8 MiB and a descriptor each). Once the stream
    closed, its queue is emptied and nothing more is queued, so hypercorn ends the
    connection (HTTP/1.1) or stream (HTTP/2) as after a body read to its end.
    """
    from hypercorn.protocol.events import Body, EndBody, StreamClosed
    from hypercorn.protocol.http_stream import HTTPStream

    original = HTTPStream.handle
    if getattr(original, "_s2_tolerant", False):
        return

    async def handle(self: Any, event: Any) -> None:
        if isinstance(event, StreamClosed):
            self._s2_closed = True
            queue = getattr(getattr(self, "app_put", None), "__self__", None)
            while isinstance(queue, asyncio.Queue) and not queue.empty():
                queue.get_nowait()  # frees a put waiting for room, and the disconnect's
        elif getattr(self, "_s2_closed", False) and isinstance(event, Body | EndBody):
            return  # answered: nobody reads it any more
        await original(self, event)

    handle._s2_tolerant = True  # type: ignore[attr-defined]
    HTTPStream.handle = handle  # type: ignore[method-assign]


async def serve(sock: socket.socket, app: Any, shutdown: asyncio.Event,
                tls: ServerTls | None) -> None:
    """Serve the ASGI `app` on the listening `sock` until `shutdown` is set."""
    from hypercorn.asyncio import serve as hypercorn_serve

    _tolerate_data_after_response()
    _drop_body_after_answer()
    if tls is not None:
        _short_tls_shutdown(asyncio.get_running_loop())
    config = _config(os.dup(sock.fileno()), tls)
    await hypercorn_serve(app, config, shutdown_trigger=shutdown.wait)
