"""The HTTP seam both protocol clients share (no pyspark, no protocol).

* `HttpClient` / `AsyncHttpClient`: prebuilt requests onto httpcore's connection pools
  (the transport under httpx), with proxies and CAs from the standard environment and the
  settings of a `TlsConfig`; `Origin` names a base URL once; `Response` is what comes back.
* `Exchange`: what one request did on the wire (sent whole? on a reused connection?),
  and `transport_error`: a transport failure as a typed error, TLS problems told apart.
"""

from s2_spark._http._client import (
    AsyncHttpClient,
    HttpClient,
    Origin,
    encode_headers,
    partial_body,
    query,
    split_url,
    timeouts,
)
from s2_spark._http._exchange import Exchange, failure_summary, transport_error
from s2_spark._http._response import AsyncResponse, Headers, Response
from s2_spark._http._routes import PoolLimits

__all__ = [
    "POOL_LIMITS",
    "AsyncHttpClient",
    "AsyncResponse",
    "Exchange",
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
