"""Waiting in tests: on a condition, with a deadline, never a sleep that hopes."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_for"]


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 120.0,
             poll: float = 0.02) -> None:
    """Return once `cond()` holds; fail naming `what` when `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(poll)
