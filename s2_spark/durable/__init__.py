"""Synchronous Durable Streams client on httpx (no pyspark): create, append, close, HEAD,
DELETE, catch-up / long-poll / SSE reads to Arrow, and an idempotent producer.

Offsets are opaque strings from the server ("-1" = start, "now" = tail), compared only as
strings. Reads and idempotent appends retry 429, 5xx and connection failures with the
shared backoff policy (`s2_spark.retry.RetryPolicy`: until its timeout passes without
progress) and resume from the last delivered offset; a plain append is retried only when
it provably never reached the server whole. Proxies and CA bundles come from the
environment; `DurableConfig.tls` (`TlsConfig`) adds a private CA or a client certificate.

    with DurableStreamsClient(DurableConfig(base_url="http://127.0.0.1:4437")) as client:
        s = client.stream("/events")
        s.create("application/json")
        s.append_json([{"event": "click"}, {"event": "scroll"}])
        for chunk in s.read("-1"):
            print(chunk.batch().column(0).to_pylist(), chunk.next_offset)
"""

from __future__ import annotations

import httpx

from s2_spark._closeable import Closeable
from s2_spark._tls import TlsConfig
from s2_spark.retry import RetryPolicy

from ._config import DurableConfig
from ._producer import IdempotentProducer
from ._reads import READ_CHUNK_BYTES, LiveMode, PieceReader, ReadChunk, ReadPiece, StreamReader
from ._stream import AppendResult, CreateResult, DurableStream, StreamInfo
from ._transport import Transport
from ._watch import REPOLL_PAUSE, DurableTailWatch

__all__ = [
    "READ_CHUNK_BYTES",
    "AppendResult",
    "CreateResult",
    "DurableConfig",
    "DurableStream",
    "DurableStreamsClient",
    "DurableTailWatch",
    "IdempotentProducer",
    "LiveMode",
    "PieceReader",
    "ReadChunk",
    "ReadPiece",
    "RetryPolicy",
    "StreamInfo",
    "StreamReader",
    "TlsConfig",
]


class DurableStreamsClient(Closeable):
    """Entry point: one connection pool shared by every stream handle it makes."""

    def __init__(
        self,
        config: DurableConfig | None = None,
        *,
        base_url: str | None = None,
        http_transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`http_transport` replaces httpx's network transport (tests, proxies)."""
        if config is None:
            config = DurableConfig(base_url=base_url)
        elif base_url is not None:
            raise ValueError("pass base_url or a config, not both")
        self.config = config
        self._t = Transport(config, http_transport)

    def __repr__(self) -> str:
        return f"DurableStreamsClient(base_url={self.config.base_url!r})"

    def stream(self, stream: str, *, content_type: str | None = None) -> DurableStream:
        """A handle on a stream given as an absolute URL or a path under base_url."""
        return DurableStream(self._t, self.config.stream_url(stream), content_type)

    def watch_tails(
        self, *, limit: int | None = None, own_connections: int | None = None,
        repoll_pause: float = REPOLL_PAUSE
    ) -> DurableTailWatch:
        """A `DurableTailWatch` over streams named as `stream` takes them, with this
        client's headers, TLS, proxies and timeouts (close it when done)."""
        return DurableTailWatch(self._t, limit=limit, own_connections=own_connections,
                                repoll_pause=repoll_pause)

    def close(self) -> None:
        self._t.close()

