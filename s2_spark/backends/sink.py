"""The one shape of a write, whatever the service (no pyspark).

The Spark layer writes every format the same way (`s2_spark.spark.writer`): on the
driver a format checks its options, input columns and target and hands over a
`SinkPlan`; each task then opens a `PartitionSink` from the plan for its `TaskAttempt`,
adds its rows as Arrow batches, and closes it, which returns one `StreamWriteResult` per
stream written. Each service's sink module fits these (`s2.sink`, `durable.sink`) and
keeps what differs: how exactly-once is made (S2: fencing-token leases; Durable
Streams: idempotent producers), its tuning (`SinkSettings`), and its own result fields.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "AfterAppend",
    "PartitionSink",
    "PickledAsFields",
    "SinkPlan",
    "SinksByStream",
    "StreamSink",
    "StreamWriteResult",
    "TaskAttempt",
    "WriteJob",
    "describe_results",
    "write_partition",
]


@dataclass(frozen=True, slots=True)
class WriteJob:
    """One batch job, or one run of a streaming query, as the driver planned it.

    `planned_ms` (epoch millis): a query restarted from its checkpoint plans later, so
    its attempts outrank every attempt of the killed run (S2 leases). `job_id`: one id
    shared by every task of a batch job (Durable Streams producer ids).
    """

    streaming: bool
    job_id: str
    planned_ms: int

    @classmethod
    def plan(cls, *, streaming: bool) -> WriteJob:
        """A new job, planned now (on the driver, once per job or query run)."""
        return cls(streaming, uuid.uuid4().hex, time.time_ns() // 1_000_000)


@dataclass(frozen=True, slots=True)
class TaskAttempt:
    """Who writes: one attempt at one input partition of a batch job or of one
    micro-batch of a streaming query (`query_id` and `batch` set for those only;
    `run_id`: the query's run, new at every start, when Spark tells it)."""

    job: WriteJob
    partition: int
    attempt: int
    query_id: str | None = None
    batch: int | None = None
    run_id: str | None = None


class StreamSink(Protocol):
    """One stream's part of a partition sink, as test hooks see it after an append."""

    @property
    def name(self) -> str: ...

    @property
    def appends(self) -> int:
        """Append requests acknowledged so far."""
        ...


#: Called after each acknowledged append, with the stream's sink (the test fault hook).
AfterAppend = Callable[[StreamSink], None]


class PickledAsFields:
    """For a slotted dataclass a task sends one of per stream to the driver: pickled as
    its fields in order. A slotted dataclass's own pickling calls `fields()` for every
    instance, which took 7% of a fan-out task's CPU at 10,000 streams."""

    __slots__ = ()

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        names: tuple[str, ...] = type(self).__slots__  # the dataclass's fields, in order
        return (type(self), tuple(getattr(self, name) for name in names))


class StreamWriteResult(Protocol):
    """What one task attempt did to one stream, in the words every service shares.

    `rows`: the attempt's rows for the stream, written now or found written by an
    earlier attempt. `appends`: append requests acknowledged. An earlier attempt's work
    found again is counted in rows (`replayed_rows`) or in append requests
    (`replayed_appends`), whichever the service can tell; the other is None.
    """

    @property
    def stream(self) -> str: ...

    @property
    def rows(self) -> int: ...

    @property
    def appends(self) -> int: ...

    @property
    def replayed_rows(self) -> int | None: ...

    @property
    def replayed_appends(self) -> int | None: ...


class PartitionSink(Protocol):
    """One task attempt's rows, written exactly once to the streams they name.

    `add` takes the task's input batches in order (the columns as the format's input
    layout places them); `close` flushes and waits for every answer; after a failure
    `abort` stops the work still running. `dropped_commands`: input rows left out
    because writing them would command the stream rather than store data (S2 command
    records; 0 for a service without them).
    """

    @property
    def dropped_commands(self) -> int: ...

    def add(self, batch: pa.RecordBatch) -> None: ...

    def close(self) -> Sequence[StreamWriteResult]: ...

    def abort(self) -> None: ...


class SinkPlan(Protocol):
    """What the driver checked, shipped to every task: opens the task's sink.

    Pickled into tasks: no connections inside, no credentials in `repr`. `finish` runs
    on the driver once a batch job committed, with every task's results, and returns
    what it did for the log (None: nothing).
    """

    def open(self, attempt: TaskAttempt, after_append: AfterAppend | None
             ) -> AbstractContextManager[PartitionSink]: ...

    def finish(self, results: Sequence[StreamWriteResult]) -> str | None: ...


SinkT = TypeVar("SinkT")


class SinksByStream(dict[str, SinkT]):
    """A partition writer's per-stream sinks in first-seen order: `sinks[name]` makes a
    stream's sink (with `make`) when its first rows arrive."""

    def __init__(self, make: Callable[[str], SinkT]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, name: str) -> SinkT:
        sink = self[name] = self._make(name)
        return sink


def write_partition(sink: PartitionSink, batches: Iterable[pa.RecordBatch]
                    ) -> list[StreamWriteResult]:
    """Every batch into `sink`, then close it; after any failure abort it and re-raise."""
    try:
        for batch in batches:
            if batch.num_rows:
                sink.add(batch)
        return list(sink.close())
    except BaseException:
        sink.abort()
        raise


def describe_results(results: Iterable[StreamWriteResult]) -> str:
    """Totals of `results` for the log: rows, appends, and what was found written."""
    rows = appends = 0
    replayed_rows: int | None = None
    replayed_appends: int | None = None
    for r in results:
        rows += r.rows
        appends += r.appends
        if r.replayed_rows is not None:
            replayed_rows = (replayed_rows or 0) + r.replayed_rows
        if r.replayed_appends is not None:
            replayed_appends = (replayed_appends or 0) + r.replayed_appends
    text = f"{rows} rows"
    if replayed_rows is not None:
        text += f" ({replayed_rows} of them already written: replayed)"
    text += f" in {appends} append requests"
    if replayed_appends is not None:
        text += f" ({replayed_appends} of them already written: replayed)"
    return text
