"""Running the local S2 server: in a background thread, or as a child process.

Both serve HTTP/1.1 and HTTP/2 cleartext (prior knowledge) on one port, which is what
s2-sdk needs over `http://`, the app behind s2-lite's compression layers
(`compression.HttpCompression`); with `ServerTls` they serve HTTPS instead (HTTP/1.1 and
HTTP/2 by ALPN), optionally requiring client certificates. The HTTP stack is granian
where installed, else hypercorn (`serving.stack`; `stack=` picks one by name).

Both count the requests they receive per kind: `request_counts()` (over the testing-only
path `GET /_local/stats` for a `ServerProcess`; not part of S2's API), and can be told to
answer an S2 error to the next requests of a kind: `inject_fault()` (testing only too).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from s2_spark.testing.semantics.app import FAULTS_PATH, STATS_PATH, S2App
from s2_spark.testing.semantics.read import HEARTBEAT_INTERVAL, HeartbeatInterval, heartbeat_range
from s2_spark.testing.semantics.store import Store
from s2_spark.testing.serving.asgi import respond_json
from s2_spark.testing.serving.compression import HttpCompression
from s2_spark.testing.serving.endpoint import ServerTls, listen, url
from s2_spark.testing.serving.faults import Fault
from s2_spark.testing.serving.stack import Serve, choose

__all__ = [
    "LocalS2Server",
    "ServerProcess",
    "ServerTls",
    "fetch_append_counts",
    "fetch_request_counts",
    "serve_forever",
]


def _quiet_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Drop the noise of connections cancelled at shutdown (and of TLS connections whose
    idle clients never answer the close); report everything else."""
    exc = context.get("exception")
    if isinstance(exc, asyncio.CancelledError | ConnectionError | TimeoutError):
        return
    loop.default_exception_handler(context)


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


class _Requests:
    """The ASGI app, remembering the task of each request it is running, so that stopping
    the server ends them at once: a long-poll waits up to 60 s, a session forever, and
    neither stack would otherwise stop before they end (hypercorn waits on HTTP/2 ones).
    A request so ended is answered 503 if its answer had not started (clients retry it)."""

    def __init__(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop  # given: finding the running loop costs a getpid() system call
        self.tasks: set[asyncio.Task[Any]] = set()
        self.stopping = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        task = asyncio.current_task(self.loop)
        if task is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.tasks.add(task)
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not self.stopping:
                raise
            with contextlib.suppress(Exception):  # an answer already started: cut short
                await respond_json(send, 503, {"code": "unavailable",
                                               "message": "the server is shutting down"})
        finally:
            self.tasks.discard(task)

    async def end(self, timeout: float = 1.0) -> None:
        """End the requests running: cancel them and wait for their 503s to go out."""
        self.stopping = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)


async def _serve(sock: socket.socket, app: Any, shutdown: asyncio.Event,
                 tls: ServerTls | None, serve: Serve) -> None:
    """Serve `app` with the stack's `serve` until `shutdown`, then end running requests."""
    requests = _Requests(app, asyncio.get_running_loop())
    stopping = asyncio.Event()
    server = asyncio.ensure_future(serve(sock, requests, stopping, tls))
    waiter = asyncio.ensure_future(shutdown.wait())
    try:
        await asyncio.wait([server, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        await requests.end()
        stopping.set()
        await server


class _Settings:
    """What both forms of the server are started with (host, port, storage, token,
    heartbeats, TLS, deletion delay, HTTP stack), and the URL they answer at."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        data_dir: str | Path | None = None,
        token: str | None = None,
        heartbeat_interval: float | HeartbeatInterval = HEARTBEAT_INTERVAL,
        tls: ServerTls | None = None,
        deletion_delay: float = 0.0,
        stack: str = "auto",
    ) -> None:
        self.stack = stack
        self.host = host
        self.port = port
        self.data_dir = None if data_dir is None else Path(data_dir)
        self._token = token
        self.heartbeat_interval = heartbeat_range(heartbeat_interval)
        self.tls = tls
        self.deletion_delay = deletion_delay

    @property
    def url(self) -> str:
        return url(self.host, self.port, self.tls)


class LocalS2Server(_Settings):
    """An S2-compatible server in a background thread with its own event loop.

    In memory unless `data_dir` is given. `url` holds the real port even for port 0.
    Read sessions send heartbeats at s2-lite's random 5-15 s; `heartbeat_interval` (seconds,
    or (low, high)) makes them come sooner in tests.
    `deletion_delay`: seconds a deleted stream or basin stays deletion pending (409
    `stream_deletion_pending`, listed with `deleted_at`) before it is removed (404);
    s2-lite removes it at once, as soon as its deletion is durable.
    `stack`: the HTTP stack (`auto`: granian where installed, else hypercorn).
    """

    # Set while running (`start`); the settings are `_Settings`'.
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _shutdown: asyncio.Event | None = None
    _sock: socket.socket | None = None
    _error: BaseException | None = None
    store: Store | None = None
    _app: S2App | None = None
    _served: HttpCompression | None = None

    def __repr__(self) -> str:
        return f"LocalS2Server(url={self.url if self._sock else None!r})"

    def start(self) -> LocalS2Server:
        if self._thread is not None:
            raise RuntimeError("LocalS2Server is already running")
        self.stack, serve = choose(self.stack)  # fails here, not in the thread
        self._sock = listen(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        self.store = Store(self.data_dir, deletion_delay=self.deletion_delay)
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
                loop.run_until_complete(
                    _serve(self._sock, served, self._shutdown, self.tls, serve))
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

    def inject_fault(self, kind: str, status: int, code: str, **how: Any) -> Fault:
        """Testing only, not S2: answer the next requests of `kind` with an S2 error
        (`Faults.arm` in `s2_spark.testing.serving.faults` says how). The returned
        fault's `fired` tells when it answered."""
        if self._app is None or self._loop is None:
            raise RuntimeError("LocalS2Server is not running")
        app = self._app

        async def arm() -> Fault:
            return app.faults.arm(kind, status, code, **how)

        return asyncio.run_coroutine_threadsafe(arm(), self._loop).result(10)

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


def _tune_gc() -> None:
    """For a server process of its own: set what is alive at start aside from the cyclic
    GC and collect less often. Each request leaves a few hundred container objects
    (scopes, tasks, generators), and with thousands of long-polls waiting the collector's
    full passes took a sixth of the server's CPU (measured: 0.235 -> 0.194 ms of the main
    thread per HTTP/2 long-poll). Not done for `LocalS2Server`: its process is the
    caller's."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)


def serve_forever(
    host: str,
    port: int,
    *,
    data_dir: str | Path | None,
    token: str | None,
    heartbeat_interval: float | HeartbeatInterval,
    tls: ServerTls | None = None,
    out: IO[str] | None = None,
    deletion_delay: float = 0.0,
    stack: str = "auto",
) -> None:
    """Run the server in this process until SIGTERM/SIGINT; print the URL when ready."""
    _, serve = choose(stack)
    sock = listen(host, port)
    store = Store(data_dir, deletion_delay=deletion_delay)
    app = S2App(store, token=token, heartbeat_interval=heartbeat_interval)

    async def main() -> None:
        shutdown = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_quiet_exception_handler)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, shutdown.set)
        stream = out or sys.stdout
        print(url(host, sock.getsockname()[1], tls), file=stream, flush=True)
        await _serve(sock, HttpCompression(app), shutdown, tls, serve)

    try:
        _tune_gc()
        asyncio.run(main())
    finally:
        store.close()
        sock.close()


class ServerProcess(_Settings):
    """The server as a child process (`python -m s2_spark.testing`), for kill -9 tests.
    `stack` as for `LocalS2Server`.

    `start()` again after `kill()` or `stop()` restarts on the same port and data dir.
    `deletion_delay` as for `LocalS2Server` (it may be changed before a restart).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        data_dir: str | Path | None = None,
        token: str | None = None,
        heartbeat_interval: float | HeartbeatInterval = HEARTBEAT_INTERVAL,
        startup_timeout: float = 30.0,
        tls: ServerTls | None = None,
        deletion_delay: float = 0.0,
        stack: str = "auto",
    ) -> None:
        super().__init__(host, port, data_dir=data_dir, token=token,
                         heartbeat_interval=heartbeat_interval, tls=tls,
                         deletion_delay=deletion_delay, stack=stack)
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[str] | None = None

    def __repr__(self) -> str:
        return f"ServerProcess(url={self.url!r}, running={self.running})"

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
            "{},{}".format(*self.heartbeat_interval),
            "--deletion-delay",
            str(self.deletion_delay),
            "--http-stack",
            self.stack,
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

    def inject_fault(self, kind: str, status: int, code: str, **how: Any) -> None:
        """Testing only, not S2: as `LocalS2Server.inject_fault`, over the testing-only
        path `POST /_local/faults`."""
        if not self.running:
            raise RuntimeError("ServerProcess is not running")
        import httpx

        headers = {} if self._token is None else {"authorization": f"Bearer {self._token}"}
        spec = {"kind": kind, "status": status, "code": code, **how}
        with httpx.Client(timeout=10.0, verify=False, trust_env=False) as client:
            client.post(self.url + FAULTS_PATH, json=spec, headers=headers).raise_for_status()

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
