"""Backends: what the protocol-neutral Spark layer needs from a stream service.

`base.StreamBackend` is the interface; `s2.S2Backend` implements it for S2 and
`durable.DurableBackend` for Durable Streams. No pyspark here.
"""

from s2_spark.backends.base import DataLossHandler, PositionT, ReadSettings, StreamBackend

__all__ = ["DataLossHandler", "PositionT", "ReadSettings", "StreamBackend"]
