"""Running the local S2 server: in a background thread, or as a child process.

Both serve HTTP/1.1 and HTTP/2 cleartext (prior knowledge) on one port through
hypercorn, which is what s2-sdk needs over `http://`, the app behind s2-lite's
compression layers (`compression.HttpCompression`); with `ServerTls` they serve
HTTPS instead (HTTP/1.1 and HTTP/2 by ALPN), optionally requiring client certificates.

Both count the requests they receive per kind: `request_counts()` (over the testing-only
path `GET /_local/stats` for a `ServerProcess`; not part of S2's API).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from s2_spark.testing.semantics.app import STATS_PATH, S2App
from s2_spark.testing.semantics.store import Store
from s2_spark.testing.serving.compression import HttpCompression

__all__ = [
    "LocalS2Server",
    "ServerProcess",
    "ServerTls",
    "fetch_append_counts",
    "fetch_request_counts",
    "serve_forever",
]


@dataclass(frozen=True, slots=True)
class ServerTls:
    """Serve HTTPS with `cert_file` (PEM chain) and `key_file`; with `client_ca_file`, also
    require a client certificate signed by one of its CAs (mutual TLS)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def args(self) -> list[str]:
        """The command-line flags of `python -m s2_spark.testing` that select this."""
        out = ["--tls-cert", self.cert_file, "--tls-key", self.key_file]
        if self.client_ca_file is not None:
            out += ["--tls-client-ca", self.client_ca_file]
        return out


#: Connections the server's listen queue holds.
LISTEN_BACKLOG = 1024


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    return sock


def _hypercorn_config(fd: int, tls: ServerTls | None) -> Any:
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
    # The listen queue `_listen` asked for (hypercorn listens again with its own, 100: a
    # watch connecting many streams at once saw SYNs dropped and connects time out).
    config.backlog = LISTEN_BACKLOG
    config.h2_max_inbound_frame_size = 1024 * 1024
    config.h11_max_incomplete_size = 1024 * 1024
    config.include_server_header = False
    return config


def _quiet_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Drop the noise of connections cancelled at shutdown (and of TLS connections whose
    idle clients never answer the close); report everything else."""
    exc = context.get("exception")
    if isinstance(exc, asyncio.CancelledError | ConnectionError | TimeoutError):
        return
    loop.default_exception_handler(context)


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


def _url(host: str, port: int, tls: ServerTls | None = None) -> str:
    scheme = "https" if tls is not None else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def fetch_request_counts(
    url: str, *, token: str | None = None, timeout: float = 10.0
) -> dict[str, int]:
    """The request counts of the local server at `url` (`GET /_local/stats`; not S2):
    kind (`check_tail`, `read`, `read_wait`, `read_session`, `append`, `list_streams`,
    ...) -> requests received since it started, the stats request itself not counted.

    Over HTTPS the server's certificate is not verified: this is for a local test server
    (a server requiring client certificates cannot be asked this way)."""
    counts: dict[str, int] = _fetch_stats(url, token, timeout)["requests"]
    return counts


def fetch_append_counts(
    url: str, *, token: str | None = None, timeout: float = 10.0
) -> dict[str, int]:
    """The appends the local server at `url` took since it started, by outcome: `landed`,
    `refused` (412: a fencing token or match_seq_num that did not match). One unary append
    or one input of an S2S session counts once. Asked as `fetch_request_counts` asks."""
    counts: dict[str, int] = _fetch_stats(url, token, timeout)["appends"]
    return counts


def _fetch_stats(url: str, token: str | None, timeout: float) -> dict[str, Any]:
    import httpx

    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    # trust_env=False: no proxy from the environment between us and a loopback server.
    with httpx.Client(timeout=timeout, verify=False, trust_env=False) as client:
        resp = client.get(url + STATS_PATH, headers=headers)
    resp.raise_for_status()
    stats: dict[str, Any] = resp.json()
    return stats


def _tolerate_data_after_response() -> None:
    """Patch hypercorn's HTTP/2 protocol to drop DATA for streams it already closed.

    When the server answers a streaming request early (say 403/404 to an S2S append
    session), the client may still have request DATA in flight. hypercorn 0.18 closes the
    stream once the response ends and then raises KeyError on that DATA, killing the whole
    connection (every other stream on it, e.g. s2-sdk's read sessions, dies too). Ignore
    such frames, handing their flow-control credit back, as RFC 9113 section 8.1 allows.
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
                await original(self, [])  # flush the WINDOW_UPDATE
            else:
                await original(self, [event])

    handle_events._s2_tolerant = True  # type: ignore[attr-defined]
    H2Protocol._handle_events = handle_events  # type: ignore[method-assign]


async def _serve(
    sock: socket.socket, app: HttpCompression, shutdown: asyncio.Event, tls: ServerTls | None
) -> None:
    from hypercorn.asyncio import serve

    _tolerate_data_after_response()
    if tls is not None:
        _short_tls_shutdown(asyncio.get_running_loop())
    config = _hypercorn_config(os.dup(sock.fileno()), tls)
    await serve(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]


class LocalS2Server:
    """An S2-compatible server in a background thread with its own event loop.

    In memory unless `data_dir` is given. `url` holds the real port even for port 0.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        data_dir: str | Path | None = None,
        token: str | None = None,
        heartbeat_interval: float = 5.0,
        tls: ServerTls | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.data_dir = None if data_dir is None else Path(data_dir)
        self._token = token
        self.heartbeat_interval = heartbeat_interval
        self.tls = tls
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._sock: socket.socket | None = None
        self._error: BaseException | None = None
        self.store: Store | None = None
        self._app: S2App | None = None
        self._served: HttpCompression | None = None

    def __repr__(self) -> str:
        return f"LocalS2Server(url={self.url if self._sock else None!r})"

    @property
    def url(self) -> str:
        return _url(self.host, self.port, self.tls)

    def start(self) -> LocalS2Server:
        if self._thread is not None:
            raise RuntimeError("LocalS2Server is already running")
        import hypercorn.asyncio  # noqa: F401  # fail here, not in the thread, if missing

        self._sock = _listen(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        self.store = Store(self.data_dir)
        app = S2App(self.store, token=self._token, heartbeat_interval=self.heartbeat_interval)
        self._app = app
        # Behind s2-lite's compression layers: answers compressed, request bodies undone.
        served = self._served = HttpCompression(app)
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            loop.set_exception_handler(_quiet_exception_handler)
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._shutdown = asyncio.Event()
            ready.set()
            try:
                assert self._sock is not None
                loop.run_until_complete(_serve(self._sock, served, self._shutdown, self.tls))
            except BaseException as e:  # surfaced by stop()
                self._error = e
            finally:
                try:
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    loop.close()

        self._thread = threading.Thread(target=run, name="s2-local-server", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def request_counts(self) -> dict[str, int]:
        """Requests received per kind since `start()` (see `fetch_request_counts`); empty
        before the first start. Read in process: no request is made."""
        return {} if self._app is None else self._app.requests.snapshot()

    def append_counts(self) -> dict[str, int]:
        """Appends taken since `start()` by outcome (see `fetch_append_counts`)."""
        return {} if self._app is None else self._app.appends.outcomes.snapshot()

    def compressed_counts(self) -> dict[str, int]:
        """Answers sent compressed since `start()`, by coding (`zstd`, `gzip`): how tests
        see that a client asked for compression and got it. Read in process."""
        return {} if self._served is None else self._served.compressed.snapshot()

    def decompressed_counts(self) -> dict[str, int]:
        """Request bodies that came compressed since `start()`, by coding. In process."""
        return {} if self._served is None else self._served.decompressed.snapshot()

    def stop(self) -> None:
        thread, loop, shutdown = self._thread, self._loop, self._shutdown
        if thread is None:
            return
        if loop is not None and shutdown is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(shutdown.set)
        thread.join(15)
        self._thread = self._loop = self._shutdown = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.store is not None:
            self.store.close()
        error, self._error = self._error, None
        if error is not None and not isinstance(error, asyncio.CancelledError):
            raise RuntimeError(f"local S2 server failed: {error!r}") from error

    def __enter__(self) -> LocalS2Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve_forever(
    host: str,
    port: int,
    *,
    data_dir: str | Path | None,
    token: str | None,
    heartbeat_interval: float,
    tls: ServerTls | None = None,
    out: IO[str] | None = None,
) -> None:
    """Run the server in this process until SIGTERM/SIGINT; print the URL when ready."""
    sock = _listen(host, port)
    store = Store(data_dir)
    app = S2App(store, token=token, heartbeat_interval=heartbeat_interval)

    async def main() -> None:
        shutdown = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_quiet_exception_handler)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, shutdown.set)
        stream = out or sys.stdout
        print(_url(host, sock.getsockname()[1], tls), file=stream, flush=True)
        await _serve(sock, HttpCompression(app), shutdown, tls)

    try:
        asyncio.run(main())
    finally:
        store.close()
        sock.close()


class ServerProcess:
    """The server as a child process (`python -m s2_spark.testing`), for kill -9 tests.

    `start()` again after `kill()` or `stop()` restarts on the same port and data dir.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        data_dir: str | Path | None = None,
        token: str | None = None,
        heartbeat_interval: float = 5.0,
        startup_timeout: float = 30.0,
        tls: ServerTls | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.data_dir = None if data_dir is None else Path(data_dir)
        self._token = token
        self.heartbeat_interval = heartbeat_interval
        self.startup_timeout = startup_timeout
        self.tls = tls
        self._proc: subprocess.Popen[str] | None = None

    def __repr__(self) -> str:
        return f"ServerProcess(url={self.url!r}, running={self.running})"

    @property
    def url(self) -> str:
        return _url(self.host, self.port, self.tls)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> ServerProcess:
        if self.running:
            raise RuntimeError("ServerProcess is already running")
        cmd = [
            sys.executable,
            "-m",
            "s2_spark.testing",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--heartbeat-interval",
            str(self.heartbeat_interval),
        ]
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir)]
        if self.tls is not None:
            cmd += self.tls.args()
        env = dict(os.environ)
        if self._token is not None:
            # Through the environment, so the token never shows in `ps` output.
            env["S2_LOCAL_SERVER_TOKEN"] = self._token
        deadline = time.monotonic() + self.startup_timeout
        while True:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True, env=env)
            assert proc.stdout is not None
            line = ""
            while time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], 0.1)
                if ready:
                    line = proc.stdout.readline()
                    break
                if proc.poll() is not None:
                    break
            if line.startswith(("http://", "https://")):
                self._proc = proc
                self.port = int(line.strip().rsplit(":", 1)[1])
                return self
            proc.kill()
            proc.wait()
            # The port may still be held by a dying predecessor: retry until the deadline.
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"local S2 server did not start within {self.startup_timeout} s "
                    f"(exit code {proc.returncode})"
                )
            time.sleep(0.2)

    def request_counts(self, *, timeout: float = 10.0) -> dict[str, int]:
        """Requests the running process received per kind since it (re)started, asked over
        `GET /_local/stats` (see `fetch_request_counts`; that request is not counted)."""
        if not self.running:
            raise RuntimeError("ServerProcess is not running")
        return fetch_request_counts(self.url, token=self._token, timeout=timeout)

    def append_counts(self, *, timeout: float = 10.0) -> dict[str, int]:
        """Appends the running process took by outcome (see `fetch_append_counts`)."""
        if not self.running:
            raise RuntimeError("ServerProcess is not running")
        return fetch_append_counts(self.url, token=self._token, timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to flush or clean up."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._close()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit in time."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._close()

    def _close(self) -> None:
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        self._proc = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
