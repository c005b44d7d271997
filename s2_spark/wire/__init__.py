"""Wire codecs with no I/O: S2S frames and ReadBatch decoding to Arrow.

`ACCELERATED` is True where the C decoders are in use (every wheel has them), False where
the codecs take their pure-Python paths (an install from source without a C compiler);
the same is logged once, at debug level, on the `s2_spark.wire` logger.
"""

from s2_spark.wire._accelerator import ACCELERATED

__all__ = ["ACCELERATED"]
