"""Durable Streams as a Spark backend: reads with exact replay over opaque offsets
(`backend`, `_range`), options (`options`), and exactly-once writes through the server's
idempotent producers (`sink`: the partition writer, `stream_sink`: one stream).

No pyspark here; the Spark layer sees only `backends.base.StreamBackend` and
`backends.sink.PartitionSink`. The names below are imported on first use
(`s2_spark._lazy`).
"""

from typing import TYPE_CHECKING

from s2_spark._lazy import lazy_exports

if TYPE_CHECKING:
    from s2_spark.backends.durable.backend import DurableBackend as DurableBackend
    from s2_spark.backends.durable.backend import StreamKind as StreamKind
    from s2_spark.backends.durable.backend import check_offset_position as check_offset_position
    from s2_spark.backends.durable.options import DurableSettings as DurableSettings

__all__ = ["DurableBackend", "DurableSettings", "StreamKind", "check_offset_position"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "DurableBackend": "s2_spark.backends.durable.backend",
    "DurableSettings": "s2_spark.backends.durable.options",
    "StreamKind": "s2_spark.backends.durable.backend",
    "check_offset_position": "s2_spark.backends.durable.backend",
})
