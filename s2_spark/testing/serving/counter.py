"""Counts by kind, shared between the local server's event loop and its readers."""

from __future__ import annotations

import threading

__all__ = ["KindCounter"]


class KindCounter:
    """Counts per kind (requests by handler, appends by outcome). Thread-safe: the app
    runs on its event loop, readers may be elsewhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1

    def snapshot(self) -> dict[str, int]:
        """Kind -> count so far, sorted by kind."""
        with self._lock:
            return dict(sorted(self._counts.items()))
