"""The Durable Streams reference server (npm `@durable-streams/server`) as a test resource.

`tests/durable_server/` pins the package (package.json + lock file; `npm install --prefix
tests/durable_server` installs it) and `start.mjs` starts it. `DurableServer` runs that
script as a child process: in memory, or file-backed with `data_dir` so a test can kill it
and start it again on the same port and data. `page_messages=N` makes it answer catch-up
reads N stored messages (appends) at a time, not up to date until the last page, as the
protocol allows and the unmodified server never does, so read paths can be tested on paging.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

__all__ = ["SERVER_DIR", "DurableServer"]

SERVER_DIR = Path(__file__).resolve().parent / "durable_server"


class DurableServer:
    """One reference server process; `url` is its base URL (streams live under it)."""

    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        long_poll_timeout: float = 1.0,
        port: int = 0,
        page_messages: int | None = None,
    ) -> None:
        if page_messages is not None and page_messages < 1:
            raise ValueError(f"page_messages must be at least 1 (got {page_messages!r})")
        self.data_dir = data_dir
        self.long_poll_timeout = long_poll_timeout
        self.port = port
        self.page_messages = page_messages
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The running server's process id (None when not started)."""
        return None if self._proc is None else self._proc.pid

    def start(self, timeout: float = 30.0) -> DurableServer:
        if not (SERVER_DIR / "node_modules" / "@durable-streams" / "server").is_dir():
            raise RuntimeError(
                "the Durable Streams reference server is not installed: run "
                "`npm install --prefix tests/durable_server` (the README's test command does)"
            )
        cmd = ["node", str(SERVER_DIR / "start.mjs"), "--port", str(self.port)]
        cmd += ["--long-poll-timeout", str(int(self.long_poll_timeout * 1000))]
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir)]
        if self.page_messages is not None:
            cmd += ["--page-messages", str(self.page_messages)]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self._proc = proc
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            if not line:
                raise RuntimeError(f"the reference server exited early (code {proc.wait()})")
            if line.startswith("listening "):
                self.port = int(line.split()[1])
                return self
        self.kill()
        raise RuntimeError(f"the reference server did not start within {timeout}s")

    def kill(self) -> None:
        """Kill the process at once (SIGKILL): no graceful flush, like a crash."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()

    def stop(self) -> None:
        """Stop gracefully (SIGTERM), falling back to a kill."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.kill()

    def __enter__(self) -> DurableServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
