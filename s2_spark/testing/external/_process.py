"""One way to pin, build, start and stop a server this project does not ship.

Each external server (s2-lite, ...) is a `Pinned` build, kept in a cache folder outside
any source tree and built once per version by its own toolchain, and an `ExternalServer`
subclass that knows its command line and how to ask whether it answers. Starting picks a
free port, waits with a deadline until the server answers, and fails with the server's own
last words when it exits or never answers; stopping sends SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TypeVar

__all__ = ["CACHE_ENV", "ExternalServer", "ExternalServerError", "Pinned", "cache_root"]

#: Where built servers are kept: this variable, else `$XDG_CACHE_HOME/s2-spark`, else
#: `~/.cache/s2-spark`.
CACHE_ENV = "S2_SPARK_CACHE"


class ExternalServerError(RuntimeError):
    """An external server could not be built or started; the message says why and what
    to do about it."""


def cache_root() -> Path:
    """The folder built servers are kept in (see `CACHE_ENV`)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "s2-spark"


@dataclass(frozen=True)
class Pinned:
    """A server at one pinned version, built by `build_command` into a folder of the cache.

    `build_command(root)` installs into `root`, a staging folder that becomes the cached
    folder only once the build succeeded, so an interrupted build is never mistaken for a
    finished one. `binary` is the executable's path relative to that folder. `tool` is the
    toolchain the build needs, `hint` what to install when it is missing."""

    name: str
    version: str
    tool: str
    hint: str
    binary: str

    def build_command(self, root: Path) -> list[str]:
        raise NotImplementedError

    @property
    def folder(self) -> Path:
        return cache_root() / self.name / self.version

    @property
    def path(self) -> Path:
        return self.folder / self.binary

    def ensure_built(self, *, log: IO[str] | None = None) -> Path:
        """The binary, built first if the cache has none for this version. Concurrent
        callers (pytest workers) build once: the others wait on a lock file."""
        if self.path.is_file():
            return self.path
        if shutil.which(self.tool) is None:
            raise ExternalServerError(
                f"{self.name} {self.version} is not built yet and `{self.tool}` is not on "
                f"PATH: {self.hint}"
            )
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        with open(self.folder.parent / f".{self.version}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.path.is_file():
                self._build(log)
        return self.path

    def _build(self, log: IO[str] | None) -> None:
        staging = Path(tempfile.mkdtemp(prefix=f".{self.version}-", dir=self.folder.parent))
        try:
            cmd = self.build_command(staging)
            done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT if log else
                                  subprocess.PIPE, text=True, check=False)
            if done.returncode != 0:
                tail = "" if log else "\n".join((done.stderr or "").splitlines()[-30:])
                raise ExternalServerError(
                    f"building {self.name} {self.version} failed (exit {done.returncode}): "
                    f"{' '.join(cmd)}\n{tail}")
            if not (staging / self.binary).is_file():
                raise ExternalServerError(
                    f"building {self.name} {self.version} made no {self.binary}")
            os.replace(staging, self.folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (for servers that cannot be told to pick one)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


S = TypeVar("S", bound="ExternalServer")


class ExternalServer:
    """A child process serving on `port` of 127.0.0.1 until stopped or killed.

    Subclasses give `command()` (the argv) and `answers()` (whether it serves yet).
    The server's output goes to a log file (`log_path`), whose tail is in every error."""

    name = "server"

    def __init__(self, *, port: int = 0, start_timeout: float = 60.0) -> None:
        self.port = port
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.log_path: Path | None = None

    # -- what a subclass says
    def command(self) -> Sequence[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def answers(self) -> bool:
        raise NotImplementedError

    # -- running
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self: S) -> S:
        """Start on `port` (a free one when 0) and return once the server answers."""
        if self.running:
            raise ExternalServerError(f"{self.name} is already running on {self.url}")
        if self.port == 0:
            self.port = free_port()
        argv = list(self.command())
        if self._log is None:
            fd, name = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
            self.log_path, self._log = Path(name), os.fdopen(fd, "wb")
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, env=self.environment(),
                                      start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise ExternalServerError(f"{self.name} exited at start (code {code}): "
                                          f"{' '.join(argv)}\n{self.log_tail()}")
            if self.answers():
                return self
            time.sleep(0.05)
        self.kill()
        raise ExternalServerError(f"{self.name} did not answer on {self.url} within "
                                  f"{self.start_timeout}s\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def kill(self) -> None:
        """SIGKILL, like a crash: nothing flushed that was not already."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL after `timeout` seconds."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        self.kill()

    def close(self) -> None:
        """Stop, and remove the log file."""
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
