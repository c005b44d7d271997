"""`LagListener`: the lag of every query's `s2` and `durable-streams` sources, logged once
per trigger and kept for code to read.

    spark.streams.addListener(LagListener())

It touches no SparkContext, so it works alike on a classic session (events come from the
JVM on py4j's callback thread) and on Spark Connect (events come to the client's listener
bus thread). Spark calls listeners on its own threads, so what it keeps sits behind a
lock. A progress it cannot read is logged at debug level and skipped: a listener that
raises would only fill Spark's log, and lag must never stop a query.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from s2_spark.lag import WORST, QueryLag, lag_of

__all__ = ["LagListener"]

log = logging.getLogger("s2_spark.lag")


class LagListener(StreamingQueryListener):
    """Logs one line per progress of a query with our sources (logger `s2_spark.lag`, at
    `level`: total lag, streams behind, the `worst` streams furthest behind) and keeps
    each query's latest `QueryLag`, by query id, until `forget`."""

    def __init__(self, *, worst: int = WORST, level: int = logging.INFO) -> None:
        self._worst = worst
        self._level = level
        self._lock = threading.Lock()
        self._latest: dict[str, QueryLag] = {}

    def latest(self, query_id: str | uuid.UUID) -> QueryLag | None:
        """The lag in the latest progress of the query with this id (`query.id`)."""
        with self._lock:
            return self._latest.get(str(query_id))

    @property
    def lag(self) -> dict[str, QueryLag]:
        """A copy of the latest lag of every query seen, by query id."""
        with self._lock:
            return dict(self._latest)

    def forget(self, query_id: str | uuid.UUID) -> None:
        """Drop what is kept for a query (a query's last lag is kept after it ends)."""
        with self._lock:
            self._latest.pop(str(query_id), None)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            lag = lag_of(event.progress)
        except Exception:
            log.debug("LagListener could not read a progress; skipped", exc_info=True)
            return
        if lag is None or not lag.sources:
            return
        # Logged first: whoever reads the kept lag finds its line already written.
        log.log(self._level, "%s", lag.describe(self._worst))
        with self._lock:
            self._latest[lag.query_id] = lag

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
