"""Synchronous S2 client on httpx: control plane, unary reads/appends, S2S read sessions.

No pyspark here: this is the engine under the Spark connector and usable on its own.

    with S2Client(S2Config(endpoint="http://127.0.0.1:8080")) as client:
        stream = client.basin("my-basin").stream("events")
        stream.append([AppendRecord(b"hello")])
        for batch in stream.read_session(seq_num=0, count=1):
            print(batch.batch.to_pylist())
"""

from s2_spark.errors import Position

from ._client import BasinClient, S2Client
from ._config import RetryPolicy, S2Config
from ._read_session import ReadSession
from ._stream import StreamClient
from ._types import (
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    AppendAck,
    AppendRecord,
    BasinInfo,
    ReadLimits,
    StreamConfig,
    StreamInfo,
)

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "AppendAck",
    "AppendRecord",
    "BasinClient",
    "BasinInfo",
    "Position",
    "ReadLimits",
    "ReadSession",
    "RetryPolicy",
    "S2Client",
    "S2Config",
    "StreamClient",
    "StreamConfig",
    "StreamInfo",
]
