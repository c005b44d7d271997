"""What the `s2` writers add to the shared ones (`spark.writer`): their options and
target, checked on the driver, and Spark Rows as the Arrow columns the sink takes.

`write_format` makes `S2_WRITE_FORMAT` (in `spark.s2.source`) of these. Each task appends its
partition through `s2_spark.backends.s2.sink` (opened by the plan, `backends.s2.plan`), which
makes the appends exactly-once. pyarrow is imported only where Spark Rows are converted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from s2_spark._options import OptionSet
from s2_spark.backends.s2.plan import InputLayout, S2SinkPlan, check_target
from s2_spark.spark._write_common import as_bytes, chunk_rows
from s2_spark.spark.s2._writer_options import WriteOptions, check_input, parse_write_options
from s2_spark.spark.writer import WriteFormat

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["parse", "plan", "rows_to_batches", "write_format"]


def write_format(options: OptionSet, home: tuple[str, str] | None = None
                 ) -> WriteFormat[WriteOptions, InputLayout]:
    """Format s2's writers, over its one option declaration (`home`: where it is defined,
    `WriteFormat.home`)."""
    return WriteFormat("s2", options, parse, check_input, plan, rows_to_batches, home)


def parse(options: Mapping[str, str], streaming: bool) -> WriteOptions:
    """The writer options (the same for `df.write` and `df.writeStream`)."""
    return parse_write_options(options)


def plan(options: WriteOptions, layout: InputLayout) -> S2SinkPlan:
    """Fail fast when the fixed target stream is missing (or create it), then plan."""
    check_target(options.settings, options.stream, options.sink)
    return S2SinkPlan(options.settings, options.stream, options.sink, layout)


def rows_to_batches(rows: Iterator[Any], layout: InputLayout) -> Iterator[pa.RecordBatch]:
    """Spark Rows -> Arrow batches (for Spark versions without the Arrow stream writer)."""
    for chunk in chunk_rows(rows):
        yield _rows_batch(chunk, layout)


def _rows_batch(rows: list[Any], layout: InputLayout) -> pa.RecordBatch:
    import pyarrow as pa

    from s2_spark.wire.records import HEADER_TYPE

    n = len(layout.names)
    columns: list[pa.Array] = [pa.nulls(len(rows))] * n
    columns[layout.body] = pa.array([as_bytes(r[layout.body]) for r in rows], pa.binary())
    if layout.headers is not None:
        columns[layout.headers] = pa.array([_headers(r[layout.headers]) for r in rows],
                                           HEADER_TYPE)
    if layout.timestamp is not None:
        ts = [r[layout.timestamp] for r in rows]
        if any(hasattr(t, "timestamp") for t in ts if t is not None):
            columns[layout.timestamp] = pa.array(
                [None if t is None else int(t.timestamp() * 1000) for t in ts], pa.int64())
        else:
            columns[layout.timestamp] = pa.array(ts, pa.int64())
    if layout.stream is not None:
        columns[layout.stream] = pa.array([r[layout.stream] for r in rows], pa.string())
    return pa.RecordBatch.from_arrays(columns, names=list(layout.names))


def _headers(h: Any) -> list[dict[str, bytes | None]] | None:
    """One row's headers (a map or a list of name/value structs) as HEADER_TYPE items."""
    if h is None:
        return None
    if isinstance(h, dict):
        return [{"name": as_bytes(k), "value": as_bytes(v)} for k, v in h.items()]
    return [{"name": as_bytes(x["name"]), "value": as_bytes(x["value"])} for x in h]
