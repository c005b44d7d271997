"""What the `durable-streams` writers add to the shared ones (`spark.writer`): their
options and fixed target, checked on the driver, and Spark Rows as the Arrow columns the
sink takes.

`write_format` makes `DURABLE_WRITE_FORMAT` (in `spark.durable.source`) of these. Each task appends
its partition through `s2_spark.backends.durable.sink`, which makes the appends
exactly-once with the server's idempotent producers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from s2_spark._options import OptionSet
from s2_spark.backends.durable.sink import DurableInputLayout, DurableSinkPlan, check_target
from s2_spark.backends.durable.stream_sink import StreamTarget, TargetError
from s2_spark.errors import OptionError
from s2_spark.spark._write_common import as_bytes, chunk_rows
from s2_spark.spark.durable._writer_options import (
    DurableWriteOptions,
    check_durable_input,
    parse_durable_write_options,
)
from s2_spark.spark.writer import WriteFormat

if TYPE_CHECKING:  # pyarrow is imported where Spark Rows are converted
    import pyarrow as pa

__all__ = ["parse", "plan", "rows_to_batches", "write_format"]


def write_format(options: OptionSet, home: tuple[str, str] | None = None
                 ) -> WriteFormat[DurableWriteOptions, DurableInputLayout]:
    """Format durable-streams' writers, over its one option declaration (`home`: where it
    is defined, `WriteFormat.home`)."""
    return WriteFormat("durable-streams", options, parse, check_durable_input, plan,
                       rows_to_batches, home)


def parse(options: Mapping[str, str], streaming: bool) -> DurableWriteOptions:
    """The writer options (closeStreamOnFinish is refused for `df.writeStream`)."""
    return parse_durable_write_options(options, streaming=streaming)


def plan(options: DurableWriteOptions, layout: DurableInputLayout) -> DurableSinkPlan:
    """Check the fixed target (it must exist or be created, be open and take the input's
    message column), then plan."""
    checked = _checked_target(options, layout)
    return DurableSinkPlan(options.settings, options.target, checked, options.sink, layout,
                           close_on_finish=options.close_on_finish)


def _checked_target(options: DurableWriteOptions, layout: DurableInputLayout
                    ) -> StreamTarget | None:
    url = options.target_url()
    if url is None:
        return None
    assert options.target is not None
    try:
        return check_target(options.settings, url, options.target, options.sink, layout.kind)
    except TargetError as err:
        raise OptionError(f"option {options.target_option}: {err}") from None


def rows_to_batches(rows: Iterator[Any], layout: DurableInputLayout
                    ) -> Iterator[pa.RecordBatch]:
    """Spark Rows -> Arrow batches (for Spark versions without the Arrow stream writer)."""
    import pyarrow as pa

    n = len(layout.names)
    for chunk in chunk_rows(rows):
        columns: list[pa.Array] = [pa.nulls(len(chunk))] * n
        columns[layout.payload] = pa.array([as_bytes(r[layout.payload]) for r in chunk],
                                           pa.binary())
        if layout.route is not None:
            columns[layout.route] = pa.array([r[layout.route] for r in chunk], pa.string())
        yield pa.RecordBatch.from_arrays(columns, names=list(layout.names))
