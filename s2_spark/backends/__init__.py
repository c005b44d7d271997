"""Backends: what the protocol-neutral Spark layer needs from a stream service.

`base.StreamBackend` is the interface; `s2.S2Backend` implements it for S2 and
`durable.DurableBackend` for Durable Streams. No pyspark here. The names below are
imported on first use (`s2_spark._lazy`): importing one backend's module does not import
the interface's (pyarrow) or the other backend's.
"""

from typing import TYPE_CHECKING

from s2_spark._lazy import lazy_exports

if TYPE_CHECKING:
    from s2_spark.backends.base import DataLossHandler as DataLossHandler
    from s2_spark.backends.base import PositionT as PositionT
    from s2_spark.backends.base import ReadSettings as ReadSettings
    from s2_spark.backends.base import StreamBackend as StreamBackend

__all__ = ["DataLossHandler", "PositionT", "ReadSettings", "StreamBackend"]

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(__all__, "s2_spark.backends.base"))
