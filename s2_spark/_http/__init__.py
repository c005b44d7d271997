"""The HTTP seam both protocol clients share (no pyspark, no protocol).

* `HttpClient`: prebuilt requests onto httpcore's connection pools (the transport under
  httpx), with proxies and CAs from the standard environment and the settings of a
  `TlsConfig`; `Origin` names a base URL once; `Response` is what comes back.
* `AsyncConnection`: HTTP/1.1 on an asyncio protocol, one request at a time, its
  messages framed by `_h1` (a response parser fuzzed against h11): each watched stream's
  long-polls; `Pipe` (`_pipe`) its connection made to carry many requests at once
  (HTTP/1.1 pipelining), as a `Pipeline` (`_pipeline`) the connections of a `Fanout` (many
  small requests at once), as a `BulkPipe` (`_bulk`) those of its tail lookups, small
  reads and appends in bulk.
* `Http2Origin` (`_h2_origin`, on `_h2_connection`): requests to one origin over HTTP/2,
  many to a connection: the tail watch's long-polls, where the service speaks it.
* `StreamedGets` (under `HttpClient.send(views=True)`): a read session's GET on a direct
  route read off a socket of its own into kept buffers, the body as views into them.
* `Fanout`: the calls of a batch sent together from threaded code, on one event loop;
  tail lookups, small reads and appends in bulk (`_bulk`, `Fanout.run_tails`,
  `run_reads`, `run_appends`): their answers read by one C call many at a time, straight
  into arrays of numbers (a read's body taken as bytes).
* `Response` (every path's answer) decodes bodies by their Content-Encoding, the one place
  that does; a body that does not decode is a `BodyDecodingError`, one longer than its
  request takes a `BodyTooLargeError` (never retried: the server's doing).
* `Exchange`: what one request did on the wire (sent whole? on a reused connection?),
  and `transport_error`: a transport failure as a typed error, TLS problems told apart.
"""

from s2_spark._http._async_connection import HEAD_BYTES, AsyncConnection, AsyncTimeouts
from s2_spark._http._client import (
    POOL_SHARDS,
    HttpClient,
    Origin,
    encode_headers,
    partial_body,
    query,
    split_url,
    timeouts,
)
from s2_spark._http._exchange import Exchange, failure_summary, transport_error
from s2_spark._http._fanout import Call, Fanout
from s2_spark._http._response import (
    MAX_BODY_BYTES,
    BodyDecodingError,
    BodyTooLargeError,
    Headers,
    Response,
)
from s2_spark._http._routes import PoolLimits

__all__ = [
    "HEAD_BYTES",
    "MAX_BODY_BYTES",
    "POOL_LIMITS",
    "POOL_SHARDS",
    "AsyncConnection",
    "AsyncTimeouts",
    "BodyDecodingError",
    "BodyTooLargeError",
    "Call",
    "Exchange",
    "Fanout",
    "Headers",
    "HttpClient",
    "Origin",
    "PoolLimits",
    "Response",
    "encode_headers",
    "failure_summary",
    "partial_body",
    "query",
    "split_url",
    "timeouts",
    "transport_error",
]

POOL_LIMITS = PoolLimits()
"""Connections per service client; at most `max_keepalive` idle ones can go stale at once."""
