"""Run a query in a child process and kill it (SIGKILL, whole process group) once it
reached a fault point (the test hook created its marker file) or a while after it started
its work."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable


def kill_at_marker(cmd: list[str], marker: str, timeout: float = 150.0) -> None:
    """Start `cmd` in its own session, wait for `marker`, then kill the session and wait
    until every process of it (driver, JVM, Python workers) is gone."""
    child = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(marker):
            assert child.poll() is None, "the query process ended before the fault point"
            assert time.monotonic() < deadline, "the query never reached the fault point"
            time.sleep(0.2)
    finally:
        _kill(child)


def kill_once(cmd: list[str], started: Callable[[], bool], delay: float,
              timeout: float = 480.0) -> None:
    """Start `cmd` in its own session; once `started()` holds, kill the session `delay`
    seconds later (unless it ended first: then it had nothing left to do) and wait until
    every process of it is gone. A child that ends before `started()` holds is not
    killed."""
    child = subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + timeout
        while not started() and child.poll() is None:
            assert time.monotonic() < deadline, "the query never started"
            time.sleep(0.2)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(delay)
    finally:
        _kill(child)


def _kill(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's session and wait until every process of it is gone."""
    with contextlib.suppress(ProcessLookupError):  # the session may have ended itself
        os.killpg(child.pid, signal.SIGKILL)
    child.wait(30)
    gone = time.monotonic() + 30
    while True:
        try:
            os.killpg(child.pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < gone, "processes of the killed query linger"
        time.sleep(0.2)
