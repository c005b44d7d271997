"""Synchronous S2 client on httpx: control plane, unary reads/appends, S2S read sessions.

No pyspark here: this is the engine under the Spark connector and usable on its own.

Retries follow `S2Config.retry`: exponential backoff with jitter until `retry.timeout`
seconds (120 by default) pass without progress, waiting at least as long as an answer's
`retry-after-ms` asks. Which answers are retryable, and which guarantee that the failed
call changed nothing, is S2's own table of error codes (`_error_codes`). Reads and
control-plane calls retry every retryable failure (network, timeouts, and 408, 429, 5xx
but 501 `not_implemented`, 409 `transaction_conflict`). A unary read cut short in transit
returns the records that arrived whole; read sessions resume after the last delivered
record with count/bytes reduced, so every record is delivered exactly once; silence
longer than `session_idle_timeout` counts as a failure. A pooled connection found dead
(closed by a server or proxy while idle) is retried at once on another. Appends retry
only when a retry cannot duplicate: the request provably never arrived whole (connect
errors, a body cut before its end) or was answered with a code S2 guarantees had no side
effect (429 `rate_limited`, 502 `hot_server`, 503 `server_draining`, 409
`transaction_conflict`; not 503 `unavailable`, 500 or 504), `match_seq_num`
makes a repeat fail with 412 (then a read-back tells whether the lost attempt landed), or
the append is a fence or trim command. Otherwise an unknown outcome is raised as
S2UnavailableError. Proxies (`HTTPS_PROXY`, `NO_PROXY`) and CA bundles (`SSL_CERT_FILE`)
come from the environment; `S2Config.tls` adds a private CA or a client certificate.
`append_many` uses S2S append sessions (half-duplex over httpx: all inputs, then all
acks), about 1.5x faster than one unary request per batch against the local server.
`BasinClient.check_tails` and `read_many` send the requests of many streams together.

    with S2Client(S2Config(endpoint="http://127.0.0.1:8080")) as client:
        stream = client.basin("my-basin").stream("events")
        stream.append([AppendRecord(b"hello")])
        for batch in stream.read_session(seq_num=0, count=1):
            print(batch.batch.to_pylist())
"""

from s2_spark.errors import Position

from ._client import BasinClient, S2Client
from ._config import RetryPolicy, S2Config, TlsConfig
from ._many import SingleAppend, SmallRead
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
    "SingleAppend",
    "SmallRead",
    "StreamClient",
    "StreamConfig",
    "StreamInfo",
    "TlsConfig",
]
