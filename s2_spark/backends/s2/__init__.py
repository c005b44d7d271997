"""S2 as a Spark backend: reads (`backend`), options (`options`), and exactly-once writes
(`sink`: the partition writer, `stream_sink`: one stream, `tokens`: the marks and
fencing tokens it leaves).

No pyspark here; the Spark layer sees only `backends.base.StreamBackend` and
`backends.sink.PartitionSink`.
"""

from s2_spark.backends.s2.backend import S2Backend, seq_num_position
from s2_spark.backends.s2.options import S2Settings

__all__ = ["S2Backend", "S2Settings", "seq_num_position"]
