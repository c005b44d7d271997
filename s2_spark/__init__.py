"""s2-spark: Spark Structured Streaming for S2 and Durable Streams.

The Spark data source is `s2_spark.spark.S2DataSource` (format name "s2"); importing this
package does not import pyspark, so the wire codecs and protocol clients work without it.
"""

from s2_spark.errors import (
    AlreadyExistsError,
    BadRequestError,
    ConditionFailedError,
    DataLossError,
    FencingTokenMismatchError,
    FrameError,
    NotFoundError,
    Position,
    RateLimitedError,
    ReadPastTailError,
    RecordTooLargeError,
    S2Error,
    S2SparkError,
    SeqNumMismatchError,
    ServiceError,
    SessionTimeoutError,
    TlsError,
    UnauthorizedError,
    UnavailableError,
)

__version__ = "0.1.0"

__all__ = [
    "AlreadyExistsError",
    "BadRequestError",
    "ConditionFailedError",
    "DataLossError",
    "FencingTokenMismatchError",
    "FrameError",
    "NotFoundError",
    "Position",
    "RateLimitedError",
    "ReadPastTailError",
    "RecordTooLargeError",
    "S2Error",
    "S2SparkError",
    "SeqNumMismatchError",
    "ServiceError",
    "SessionTimeoutError",
    "TlsError",
    "UnauthorizedError",
    "UnavailableError",
    "__version__",
]
