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

The names below are imported on first use (`s2_spark._lazy`): a module of this package
that needs none of the client (its types, its limits) does not import the HTTP stack.
"""

from typing import TYPE_CHECKING

from s2_spark._lazy import lazy_exports
from s2_spark.errors import Position

if TYPE_CHECKING:
    from ._client import BasinClient as BasinClient
    from ._client import S2Client as S2Client
    from ._config import RetryPolicy as RetryPolicy
    from ._config import S2Config as S2Config
    from ._config import TlsConfig as TlsConfig
    from ._many import SingleAppend as SingleAppend
    from ._many import SmallRead as SmallRead
    from ._read_session import ReadSession as ReadSession
    from ._stream import StreamClient as StreamClient
    from ._types import MAX_BATCH_BYTES as MAX_BATCH_BYTES
    from ._types import MAX_BATCH_RECORDS as MAX_BATCH_RECORDS
    from ._types import AppendAck as AppendAck
    from ._types import AppendRecord as AppendRecord
    from ._types import BasinInfo as BasinInfo
    from ._types import ReadLimits as ReadLimits
    from ._types import StreamConfig as StreamConfig
    from ._types import StreamInfo as StreamInfo

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

_CLIENT, _CONFIG, _TYPES = (f"{__name__}.{m}" for m in ("_client", "_config", "_types"))

__getattr__, __dir__ = lazy_exports(__name__, {
    "BasinClient": _CLIENT,
    "S2Client": _CLIENT,
    "RetryPolicy": _CONFIG,
    "S2Config": _CONFIG,
    "TlsConfig": _CONFIG,
    "SingleAppend": f"{__name__}._many",
    "SmallRead": f"{__name__}._many",
    "ReadSession": f"{__name__}._read_session",
    "StreamClient": f"{__name__}._stream",
    **dict.fromkeys(("MAX_BATCH_BYTES", "MAX_BATCH_RECORDS", "AppendAck", "AppendRecord",
                     "BasinInfo", "ReadLimits", "StreamConfig", "StreamInfo"), _TYPES),
})
