"""s2-spark: Spark Structured Streaming for S2 and Durable Streams, exactly-once.

Two formats, one per service: `format("s2")` (`s2_spark.spark.S2DataSource`) and
`format("durable-streams")` (`s2_spark.spark.DurableStreamsDataSource`), installed with
the package. Their protocol clients work without Spark: `s2_spark.s2` (S2 and s2-lite)
and `s2_spark.durable` (Durable Streams); `s2_spark.testing` is a local S2 server.
Importing this package does not import pyspark. Errors of both services share one
vocabulary (`s2_spark.errors`), exported here.
`lag_of` reads a streaming progress without pyspark; `LagListener`, a Spark listener, is
imported (and pyspark with it) only when first used. The lag names are imported on first
use too: every Spark interpreter that unpickles our objects imports this package.
"""

from typing import TYPE_CHECKING, Any

from s2_spark._version import __version__
from s2_spark.errors import (
    AlreadyExistsError,
    BadRequestError,
    ConditionFailedError,
    ConflictError,
    DataLossError,
    DeletionPendingError,
    DurableStreamsError,
    EncryptionKeyError,
    FencedError,
    FencingTokenMismatchError,
    FrameError,
    MalformedResponseError,
    NotFoundError,
    OffsetGoneError,
    OptionError,
    Position,
    RateLimitedError,
    ReadPastTailError,
    RecordTooLargeError,
    ReplayMismatchError,
    S2BadRequestError,
    S2Error,
    S2NotFoundError,
    S2RateLimitedError,
    S2SparkError,
    S2UnauthorizedError,
    S2UnavailableError,
    SeqNumMismatchError,
    SequenceGapError,
    ServiceError,
    SessionTimeoutError,
    StaleEpochError,
    StreamBadRequestError,
    StreamClosedError,
    StreamConflictError,
    StreamNotFoundError,
    StreamRateLimitedError,
    StreamUnauthorizedError,
    StreamUnavailableError,
    TlsError,
    UnauthorizedError,
    UnavailableError,
    WriterFencedError,
)

if TYPE_CHECKING:
    from s2_spark.lag import QueryLag as QueryLag
    from s2_spark.lag import SourceLag as SourceLag
    from s2_spark.lag import StreamLag as StreamLag
    from s2_spark.lag import lag_of as lag_of
    from s2_spark.lag_listener import LagListener as LagListener

# `LagListener` is public but left out: `from s2_spark import *` must work without pyspark.
__all__ = [
    "AlreadyExistsError",
    "BadRequestError",
    "ConditionFailedError",
    "ConflictError",
    "DataLossError",
    "DeletionPendingError",
    "DurableStreamsError",
    "EncryptionKeyError",
    "FencedError",
    "FencingTokenMismatchError",
    "FrameError",
    "MalformedResponseError",
    "NotFoundError",
    "OffsetGoneError",
    "OptionError",
    "Position",
    "QueryLag",
    "RateLimitedError",
    "ReadPastTailError",
    "RecordTooLargeError",
    "ReplayMismatchError",
    "S2BadRequestError",
    "S2Error",
    "S2NotFoundError",
    "S2RateLimitedError",
    "S2SparkError",
    "S2UnauthorizedError",
    "S2UnavailableError",
    "SeqNumMismatchError",
    "SequenceGapError",
    "ServiceError",
    "SessionTimeoutError",
    "SourceLag",
    "StaleEpochError",
    "StreamBadRequestError",
    "StreamClosedError",
    "StreamConflictError",
    "StreamLag",
    "StreamNotFoundError",
    "StreamRateLimitedError",
    "StreamUnauthorizedError",
    "StreamUnavailableError",
    "TlsError",
    "UnauthorizedError",
    "UnavailableError",
    "WriterFencedError",
    "__version__",
    "lag_of",
]


_LAG_NAMES = ("QueryLag", "SourceLag", "StreamLag", "lag_of")


def __getattr__(name: str) -> Any:
    """The lag names on first use; `LagListener` too (it subclasses pyspark's listener)."""
    if name == "LagListener":
        from s2_spark.lag_listener import LagListener

        return LagListener
    if name in _LAG_NAMES:
        import s2_spark.lag

        value = getattr(s2_spark.lag, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 's2_spark' has no attribute {name!r}")
