"""The executor's half of a read: one planned partition, read exactly, data loss failing
the task or logged per failOnDataLoss."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from s2_spark.backends._batches import coalesced
from s2_spark.backends.base import DataLossHandler, RangeRead, ReadSettings
from s2_spark.errors import DataLossError
from s2_spark.spark._planner import Backend, Position
from s2_spark.spark._worker_heap import settled_after
from s2_spark.spark.options import ReadOptions
from s2_spark.spark.partitions import PackedPartition, RangePartition

__all__ = ["LOSS_HINT", "loss_handler", "read_partition"]

log = logging.getLogger("s2_spark.spark")

LOSS_HINT = "set the option failOnDataLoss=false to skip missing records and go on"


def loss_handler(backend: Backend, options: ReadOptions) -> DataLossHandler:
    """Fail, or log and go on, per failOnDataLoss, when planned records are gone."""

    def on_data_loss(stream: str, start: Position, end: Position) -> None:
        span = f"records [{start}, {end})" if start != end else f"records from {start}"
        what = (
            f"{span} of {backend.describe(stream)} were planned to be read but are gone "
            "(trimmed by retention or a trim command, or the stream was deleted)"
        )
        if options.fail_on_data_loss:
            raise DataLossError(
                f"Data loss: {what}; {LOSS_HINT}", stream=stream, start=start, end=end
            )
        log.warning("Skipping lost records (failOnDataLoss=false): %s", what)

    return on_data_loss


def read_partition(
    backend: Backend, options: ReadOptions, partition: InputPartition
) -> Iterator[pa.RecordBatch]:
    """Read one planned partition on an executor; data loss fails or is logged per option.

    A packed partition's ranges are read in their planned order (`read_ranges`: the
    backend reads small ones ahead), and their rows go out in batches of about
    `COALESCE_ROWS`. Once they are out, a reused worker's heap is settled
    (`_worker_heap`)."""
    on_data_loss = loss_handler(backend, options)
    settings = ReadSettings(
        include_headers=options.include_headers,
        include_command_records=options.include_command_records,
    )
    if isinstance(partition, RangePartition):
        return settled_after(backend.read(partition.stream, partition.start, partition.end,
                                          settings, on_data_loss,
                                          leading_gap_ok=partition.from_origin))
    assert isinstance(partition, PackedPartition)
    ranges = [RangeRead(r.stream, r.start, r.end, r.from_origin) for r in partition.ranges]
    return settled_after(coalesced(backend.read_ranges(ranges, settings, on_data_loss)))
