"""Durable Streams as a Spark backend: reads with exact replay over opaque offsets
(`backend`, `_range`), options (`options`), and exactly-once writes through the server's
idempotent producers (`sink`: the partition writer, `stream_sink`: one stream).

No pyspark here; the Spark layer sees only `backends.base.StreamBackend` and
`backends.sink.PartitionSink`.
"""

from s2_spark.backends.durable.backend import DurableBackend, StreamKind, check_offset_position
from s2_spark.backends.durable.options import DurableSettings

__all__ = ["DurableBackend", "DurableSettings", "StreamKind", "check_offset_position"]
