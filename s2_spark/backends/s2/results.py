"""What an S2 writer reports per stream, in its task's commit message (no pyspark).

Spark's commit runner unpickles the commit messages every micro-batch: this module
imports nothing heavy, so neither does it (`stream_sink`, which makes these, does).
"""

from __future__ import annotations

from dataclasses import dataclass

from s2_spark.backends.sink import PickledAsFields

__all__ = ["StreamWriteResult"]


@dataclass(frozen=True, slots=True)
class StreamWriteResult(PickledAsFields):
    """What one writer did to one stream: rows appended, rows found already there (the
    shared `backends.sink.StreamWriteResult` fields are derived from these)."""

    stream: str
    appended: int
    skipped: int
    first_seq_num: int | None
    end_seq_num: int | None
    appends: int

    @property
    def rows(self) -> int:
        """The writer's rows for the stream: appended now or found already there."""
        return self.appended + self.skipped

    @property
    def replayed_rows(self) -> int:
        return self.skipped

    @property
    def replayed_appends(self) -> None:
        """Not told: the rows found already there are counted, not their appends."""
        return None
