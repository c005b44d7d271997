"""The S2 sink's limits and tuning: how much one append carries, how many are in flight;
and where a write's columns are (`InputLayout`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from s2_spark.s2._limits import MAX_TOKEN_BYTES

__all__ = [
    "DATA_MAX_BYTES",
    "DATA_MAX_RECORDS",
    "DEFAULT_APPENDS_IN_FLIGHT",
    "FENCE_RESERVE",
    "AppendBudget",
    "InputLayout",
    "SinkSettings",
]

#: Metered size of the two fence records that end every data append (the writer's mark
#: and the token), each 8 + 2 * 1 header + len("fence") + at most 36 bytes.
FENCE_RESERVE = 2 * (8 + 2 + len("fence") + MAX_TOKEN_BYTES)
#: Data records in one append: S2's 1000 less the mark and the token.
DATA_MAX_RECORDS = 998
#: Appends a writer has sent and not yet seen acknowledged, across its streams (one
#: stream sends at most `max_inflight_bytes` in a session).
DEFAULT_APPENDS_IN_FLIGHT = 64
DATA_MAX_BYTES = 1024 * 1024 - FENCE_RESERVE


class AppendBudget:
    """Appends one writer has in flight, across all its streams, at most `limit`.

    A stream takes permits for one request (a fence, or a chain of appends) and gives
    them back when its response is read; permits are never held while waiting for
    anything else, so holding them cannot deadlock.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._free = self.limit
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, want: int) -> Iterator[int]:
        """Wait for a free permit, then take up to `want`; yields how many were taken."""
        with self._cond:
            self._cond.wait_for(lambda: self._free > 0)
            taken = min(max(1, want), self._free)
            self._free -= taken
        try:
            yield taken
        finally:
            with self._cond:
                self._free += taken
                self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """Tuning and behaviour of the sink.

    `flush_records` / `flush_bytes`: rows buffered before they are appended. Each flush
    is one S2S session at least, whose requests cost the client about as much as a few
    thousand rows: a flush of up to `max_inflight_appends` full appends (64 x 998 rows,
    or the 4 MiB `flush_bytes` first: about 40,000 rows of 100 B) spreads that over
    enough rows (the cost of a 100 B row fell by a third against 8 appends a flush).
    `max_inflight_appends`: appends one writer has sent and not yet seen acknowledged,
    in total across its streams (one stream's go out as one session). `max_inflight_bytes`
    (metered): the most one stream sends in one session before reading the acks.
    """

    create_streams: bool = False
    max_records: int = DATA_MAX_RECORDS
    flush_records: int = DEFAULT_APPENDS_IN_FLIGHT * DATA_MAX_RECORDS
    flush_bytes: int = 4 * 1024 * 1024
    max_inflight_appends: int = DEFAULT_APPENDS_IN_FLIGHT
    max_inflight_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class InputLayout:
    """Where the accepted columns are in the input rows (None when absent)."""

    body: int
    headers: int | None
    timestamp: int | None
    stream: int | None
    names: tuple[str, ...]
