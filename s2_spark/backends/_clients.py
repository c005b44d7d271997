"""Protocol clients shared by the backends of one process, one per settings.

Spark reuses Python workers and every task unpickles its own backend, so a client
(connection pools) kept per process and settings spares a new connection per task. The
client spreads its threads over several pools itself (`s2_spark._http.POOL_SHARDS`).

Nothing here imports pyspark.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["SharedClients"]

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")


class SharedClients(Generic[K, C]):
    """The clients of one protocol, made by `make(settings)` on first use."""

    def __init__(self, make: Callable[[K], C]) -> None:
        self._make = make
        self._clients: dict[K, C] = {}
        self._lock = threading.Lock()

    def get(self, settings: K) -> C:
        """The client for `settings`."""
        with self._lock:
            client = self._clients.get(settings)
            if client is None:
                client = self._clients[settings] = self._make(settings)
        return client
