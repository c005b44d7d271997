"""minRecordsPerTrigger / maxTriggerDelay: a trigger that finds too few new records waits.

Kafka's minOffsetsPerTrigger and maxTriggerDelay, for a Python source: Spark hands
`latestOffset` only one `ReadLimit` (no composite, no delay), so the source keeps the
minimum and the clock itself. A plan that finds fewer new records than the minimum, across
the query's streams, returns its start unchanged and Spark runs no micro-batch; once the
delay has passed since the last micro-batch was planned (or since the query's first plan),
a plan takes what there is.

While a trigger is held Spark asks again every few milliseconds. The counts of the held
plans are kept, per stream up to the tail last counted to, so a later plan counts only
what came after it, and never more than the minimum in all: a service that counts by
reading reads no more than the minimum while a trigger waits. `tails` are the tails the
held plans saw, for the reader's tail watch to wait on past them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from s2_spark.backends.base import StreamBackend

__all__ = ["TriggerHold"]

Position = Any
#: Records in each of some ranges {stream: (start, end)}, each counted up to a limit.
CountRanges = Callable[[Mapping[str, tuple[Position, Position]], int], Mapping[str, int]]


class TriggerHold:
    """Whether the next micro-batch waits for more records (driver only, per query run)."""

    def __init__(self, minimum: int, delay_ms: int, backend: StreamBackend[Any],
                 count: CountRanges, clock: Callable[[], float] = time.monotonic) -> None:
        self.minimum = minimum
        self._delay = delay_ms / 1000
        self._backend = backend
        self._count_ranges = count
        self._clock = clock
        self._since: float | None = None  # the last micro-batch planned, or the first plan
        self._start: dict[str, Position] | None = None  # what the counts count from
        self._counted: dict[str, tuple[Position, int]] = {}  # stream -> (up to, records)
        self._tails: dict[str, Position] = {}

    def __repr__(self) -> str:
        return f"TriggerHold(minimum={self.minimum}, delay_s={self._delay})"

    def remaining(self) -> float:
        """Seconds until the delay has passed (0 once it has)."""
        if self._since is None:
            return self._delay
        return max(0.0, self._since + self._delay - self._clock())

    def tails(self, start: Mapping[str, Position]) -> dict[str, Position]:
        """The tails held plans from `start` saw, of streams with new records."""
        return dict(self._tails) if self._start == start else {}

    def holds(self, start: Mapping[str, Position], begin: Mapping[str, Position],
              tails: Mapping[str, Position]) -> bool:
        """Whether the plan from `start` (streams read from `begin` to `tails`) waits."""
        if self._since is None:
            self._since = self._clock()
        if self._start != start:
            self._start, self._counted, self._tails = dict(start), {}, {}
        if self.remaining() <= 0 or self._count(begin, tails) >= self.minimum:
            self._tails = {}
            return False
        after = self._backend.is_after
        self._tails = {s: tails[s] for s in begin if s in tails and after(tails[s], begin[s])}
        return True

    def planned(self, start: Mapping[str, Position], end: Mapping[str, Position]) -> None:
        """A plan ended at `end`: a micro-batch (end moved) starts the delay over."""
        if end != start:
            self._since = self._clock()
            self._start, self._counted, self._tails = None, {}, {}

    def _count(self, begin: Mapping[str, Position], tails: Mapping[str, Position]) -> int:
        """New records in all, counted on from where held plans counted to, and only as
        far as the minimum needs (a stream not counted whole ends the hold anyway)."""
        counted = {s: self._counted.get(s, (pos, 0)) for s, pos in begin.items()}
        need = self.minimum - sum(n for _, n in counted.values())
        moved = {s: (at, tails[s]) for s, (at, _) in sorted(counted.items())
                 if s in tails and self._backend.is_after(tails[s], at)}
        if need > 0 and moved:
            for s, n in self._count_ranges(moved, need).items():
                counted[s] = (tails[s], counted[s][1] + n)
        self._counted = counted
        return sum(n for _, n in counted.values())
