"""What the writers of both formats share: the Spark-facing writer methods (`write`,
`commit`, `abort`) built on a job's `write_batches` / `write_rows` / `summarize`, row
chunking (Spark 4.0 hands Python stream writers rows, not Arrow), byte conversion of row
values, and the test-only fault hook."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from s2_spark._option_spec import Option

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.datasource import WriterCommitMessage

__all__ = [
    "ROW_CHUNK",
    "TEST_FAULT",
    "ArrowInput",
    "MicroBatchCommits",
    "RowInput",
    "WriterJob",
    "as_bytes",
    "chunk_rows",
    "fault_hook",
]

#: Rows turned into one Arrow batch on the row path.
ROW_CHUNK = 4096

#: TEST-ONLY hook (not a user option, left out of the docs): "fail:N:B:/marker" or
#: "hang:N:B:/marker" makes a task of micro-batch B ("*": any) fail, or hang until killed,
#: right after its N-th append, once per marker file.
TEST_FAULT = Option("_testFaultAfterAppends", "fail:N:B:/marker, hang:N:B:/marker",
                    "Test hook.", roles=("write",), hidden=True)


class WriterJob:
    """What a format's writer job provides; the mixins below turn it into Spark's methods."""

    def write_batches(self, batches: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        raise NotImplementedError

    def write_rows(self, rows: Iterator[Any]) -> WriterCommitMessage:
        raise NotImplementedError

    def summarize(self, messages: list[WriterCommitMessage | None], what: str) -> object:
        """Log what the tasks wrote (`what`: "job", "micro-batch 3 aborted", ...)."""
        raise NotImplementedError


class ArrowInput(WriterJob):
    """`write` for Arrow writers (`DataSourceArrowWriter`, `DataSourceStreamArrowWriter`)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.write_batches(iterator)


class RowInput(WriterJob):
    """`write` for row writers (Spark 4.0's `DataSourceStreamWriter`)."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.write_rows(iterator)


class MicroBatchCommits(WriterJob):
    """`commit` / `abort` of stream writers: a summary of the micro-batch in the log."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.summarize(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.summarize(messages, f"micro-batch {batchId} aborted")


def chunk_rows(rows: Iterator[Any], size: int = ROW_CHUNK) -> Iterator[list[Any]]:
    """Spark Rows in lists of at most `size`, in order."""
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def as_bytes(v: Any) -> bytes | None:
    """A row value (str, bytes, bytearray, memoryview or None) as bytes."""
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


def fault_hook(spec: str | None, batch: int) -> Callable[[Any], None] | None:
    """TEST-ONLY fault injection (option `_testFaultAfterAppends`).

    "fail:N:B:/marker" raises right after the task's N-th append in micro-batch B ("*":
    any); "hang:N:B:/marker" blocks there until the process is killed. Fires once: the
    marker file is created when it fires. The hook is called with the writer's per-stream
    object, which has `name` and `appended`.
    """
    if not spec:
        return None
    kind, count_raw, batch_raw, marker = spec.split(":", 3)
    count = int(count_raw)
    if batch_raw != "*" and int(batch_raw) != batch:
        return None
    state = {"n": 0}

    def hook(sink: Any) -> None:
        state["n"] += 1
        if state["n"] != count or os.path.exists(marker):
            return
        with open(marker, "w") as f:
            f.write(f"{sink.name} {sink.appended}\n")
        if kind == "hang":
            while True:
                time.sleep(1)
        raise RuntimeError(f"injected failure after {count} appends (test hook)")

    return hook
