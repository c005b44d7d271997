"""S2 as a Spark backend: reads (`backend`), options (`options`), and exactly-once writes
(`sink`: the partition writer, `stream_sink`: one stream, `tokens`: the marks and
fencing tokens it leaves).

No pyspark here; the Spark layer sees only `backends.base.StreamBackend` and
`backends.sink.PartitionSink`. The names below are imported on first use
(`s2_spark._lazy`).
"""

from typing import TYPE_CHECKING

from s2_spark._lazy import lazy_exports

if TYPE_CHECKING:
    from s2_spark.backends.s2.backend import S2Backend as S2Backend
    from s2_spark.backends.s2.backend import seq_num_position as seq_num_position
    from s2_spark.backends.s2.options import S2Settings as S2Settings

__all__ = ["S2Backend", "S2Settings", "seq_num_position"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "S2Backend": "s2_spark.backends.s2.backend",
    "S2Settings": "s2_spark.backends.s2.options",
    "seq_num_position": "s2_spark.backends.s2.backend",
})
