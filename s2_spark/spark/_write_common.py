"""Helpers a format's writer module uses (the writers themselves are `spark.writer`):
input columns mapped by name with errors naming the format, row chunking (Spark 4.0
hands Python stream writers rows, not Arrow), byte conversion of row values, and the
test-only fault hook."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from s2_spark._options import Option
from s2_spark.errors import OptionError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from s2_spark.backends.sink import StreamSink

__all__ = [
    "ROW_CHUNK",
    "TEST_FAULT",
    "as_bytes",
    "chunk_rows",
    "column_type_error",
    "fault_hook",
    "input_columns",
]

#: Rows turned into one Arrow batch on the row path.
ROW_CHUNK = 4096

#: TEST-ONLY hook (not a user option, left out of the docs): "fail:N:B:/marker" or
#: "hang:N:B:/marker" makes a task of micro-batch B ("*": any) fail, or hang until killed,
#: right after its N-th append, once per marker file.
TEST_FAULT = Option("_testFaultAfterAppends", "fail:N:B:/marker, hang:N:B:/marker",
                    "Test hook.", roles=("write",), hidden=True)


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


def input_columns(schema: StructType, fmt: str, known: tuple[str, ...], accepted: str
                  ) -> dict[str, int]:
    """Each input column's position by its lower-case name; raise naming a column that
    is not in `known` or that appears twice (`accepted`: the columns, for the message)."""
    found: dict[str, int] = {}
    for i, f in enumerate(schema.fields):
        key = f.name.lower()
        if key not in known:
            raise OptionError(
                f"column {f.name} is not accepted by format {fmt}: drop or rename it. "
                f"Accepted columns: {accepted}"
            )
        if key in found:
            raise OptionError(f"column {f.name} appears more than once in the input")
        found[key] = i
    return found


def column_type_error(fmt: str, column: str, type_name: str, must_be: str, accepted: str
                      ) -> OptionError:
    """An input column of a type the format cannot write."""
    return OptionError(
        f"column {column} has type {type_name}, which format {fmt} cannot write: "
        f"{column} must be {must_be}. Accepted columns: {accepted}"
    )


def fault_hook(spec: str | None, batch: int) -> Callable[[StreamSink], None] | None:
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

    def hook(sink: StreamSink) -> None:
        state["n"] += 1
        if state["n"] != count or os.path.exists(marker):
            return
        with open(marker, "w") as f:
            f.write(f"{sink.name} {sink.appends}\n")
        if kind == "hang":
            while True:
                time.sleep(1)
        raise RuntimeError(f"injected failure after {count} appends (test hook)")

    return hook
