"""The plan of an S2 write, shipped to its tasks, and the check of its target on the
driver (no pyspark).

Spark's planner interpreters unpickle this plan (in the stream writer) every micro-batch:
this module imports no pyarrow and no HTTP stack; `S2SinkPlan.open` imports the partition
writer (`sink`) and the client in the task that writes, and `check_target` the client on
the driver that checks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from s2_spark.backends.s2._deletion import being_deleted
from s2_spark.backends.s2.settings import InputLayout, SinkSettings
from s2_spark.errors import AlreadyExistsError, DeletionPendingError, NotFoundError, OptionError

if TYPE_CHECKING:
    from s2_spark.backends.s2.options import S2Settings
    from s2_spark.backends.s2.sink import S2PartitionSink
    from s2_spark.backends.sink import AfterAppend, TaskAttempt
    from s2_spark.backends.sink import StreamWriteResult as AnyStreamWriteResult

__all__ = ["InputLayout", "S2SinkPlan", "check_target"]


@dataclass(frozen=True, slots=True)
class S2SinkPlan:
    """The checked basin, target and tuning of one write, shipped to its tasks."""

    settings: S2Settings
    stream: str | None  # the one target of every row (None: rows name theirs)
    sink: SinkSettings
    layout: InputLayout

    @contextlib.contextmanager
    def open(self, attempt: TaskAttempt, after_append: AfterAppend | None
             ) -> Iterator[S2PartitionSink]:
        """A client for the task and the attempt's writer, closed after it."""
        from s2_spark.backends.s2.sink import PartitionWriter, S2PartitionSink, writer_id
        from s2_spark.s2 import S2Client

        with S2Client(self.settings.config()) as client:
            basin = client.basin(self.settings.basin)
            writer = PartitionWriter(basin, writer_id(attempt), self.sink,
                                     after_append=after_append)
            yield S2PartitionSink(writer, self.layout, self.stream)

    def finish(self, results: Sequence[AnyStreamWriteResult]) -> None:
        """Nothing to do once a job committed: every append released its stream."""
        return None


def check_target(settings: S2Settings, stream: str | None, sink: SinkSettings) -> None:
    """Fail fast (before any task runs) when the fixed target stream is missing, or
    create it (createStreams)."""
    if stream is None:
        return
    from s2_spark.s2 import S2Client

    with S2Client(settings.config()) as client:
        basin = client.basin(settings.basin)
        what = f"stream {stream!r} in basin {settings.basin!r}"
        try:
            basin.stream(stream).check_tail()
        except NotFoundError as missing:
            if missing.deletion_pending:
                raise being_deleted(what, missing, sink.create_streams) from None
            if not sink.create_streams:
                raise OptionError(
                    f"stream {stream!r} does not exist in basin {settings.basin!r}: create it "
                    "first, or set option createStreams=true"
                ) from None
            # Not `ensure_stream`: a PUT would reset the config of a stream created
            # meanwhile by someone else (S2 replaces the whole config).
            try:
                with contextlib.suppress(AlreadyExistsError):
                    basin.create_stream(stream)
            except DeletionPendingError as exc:
                raise being_deleted(what, exc, True) from None

