"""Protocol clients shared by the backends of one process, a few per settings.

Spark reuses Python workers and every task unpickles its own backend, so a client
(connection pool) kept per process and settings spares a new connection per task. Each
thread keeps to one of `CLIENT_SHARDS` clients: httpcore takes a pool-wide lock and looks
at every pooled connection on each request, which made 16-32 threads sharing one pool
spend more on the pool than on their requests.

Nothing here imports pyspark.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["CLIENT_SHARDS", "SharedClients"]

CLIENT_SHARDS = 8

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")

_THREAD = threading.local()
_NEXT_SHARD = itertools.count()


def _shard() -> int:
    """This thread's shard, given on first use, round robin."""
    shard: int | None = getattr(_THREAD, "shard", None)
    if shard is None:
        shard = _THREAD.shard = next(_NEXT_SHARD) % CLIENT_SHARDS
    return shard


class SharedClients(Generic[K, C]):
    """The clients of one protocol, made by `make(settings)` on first use per shard."""

    def __init__(self, make: Callable[[K], C]) -> None:
        self._make = make
        self._clients: dict[tuple[K, int], C] = {}
        self._lock = threading.Lock()

    def get(self, settings: K) -> C:
        """The client this thread uses for `settings`."""
        key = (settings, _shard())
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = self._make(settings)
        return client
