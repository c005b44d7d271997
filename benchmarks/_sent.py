"""Requests this process sent, counted at the client's sending calls: for a server without
the local server's request counters (s2-lite, S2), where a benchmark runs the client in
its own process (not in Spark's).

    sent = Sent.requests()      # every request of the client's HTTP paths
    polls = Sent([(TailWatch, "_request")])  # the tail watch's polls only
    ... sent.count ...
    sent.stop()                 # the methods as they were (a process that goes on)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Sent"]


class Sent:
    """Counts the calls of `methods` ((class, name) pairs) from now on, in every thread."""

    def __init__(self, methods: list[tuple[type, str]]) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._replaced: list[tuple[type, str, Any]] = []
        for cls, name in methods:
            self._replaced.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, self._counting(getattr(cls, name)))

    def stop(self) -> None:
        """Stop counting: the methods as they were before (latest `Sent` first)."""
        for cls, name, method in reversed(self._replaced):
            setattr(cls, name, method)
        self._replaced.clear()

    def _counting(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.count += 1
            return method(*args, **kwargs)

        return counted

    @classmethod
    def requests(cls) -> Sent:
        """Every request the client sends: its blocking requests (streamed reads among
        them) and the asyncio connections' (HTTP/1.1 and HTTP/2) of the fan-out and the
        tail watch."""
        from s2_spark._http._async_connection import AsyncConnection
        from s2_spark._http._client import HttpClient
        from s2_spark._http._h2_connection import H2Connection

        return cls([(HttpClient, "send"), (AsyncConnection, "send"), (H2Connection, "send")])
