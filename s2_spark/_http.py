"""The HTTP seam both protocol clients share (no pyspark, no protocol).

* `http_client`: the one httpx client a service client owns: pool limits, no redirects,
  proxies and CA bundles from the standard environment (`HTTPS_PROXY`, `HTTP_PROXY`,
  `NO_PROXY`, `SSL_CERT_FILE`, `SSL_CERT_DIR`), and the settings of a `TlsConfig`.
* `Exchange`: what one request did on the wire, from httpcore's trace events: whether it
  went out on a pooled connection, was sent completely, got a response. After a transport
  failure that tells whether the request cannot have taken effect (`unsent`) and whether
  the pooled connection was already dead (`stale`: closed by the server, a proxy or a load
  balancer while idle), which is no failure of the service at all.
* `transport_error`: a transport failure as a typed error, TLS problems told apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from s2_spark._tls import TlsConfig, tls_problem
from s2_spark.errors import ServiceError, TlsError

__all__ = ["POOL_LIMITS", "Exchange", "failure_summary", "http_client", "transport_error"]

POOL_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=16)
"""Connections per service client; at most this many idle ones can go stale at once."""

def http_client(
    *,
    timeout: httpx.Timeout,
    headers: Mapping[str, str],
    tls: TlsConfig | None = None,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """An HTTP/1.1 client honouring the standard proxy and CA environment variables."""
    return httpx.Client(
        transport=transport,
        timeout=timeout,
        limits=POOL_LIMITS,
        headers=dict(headers),
        follow_redirects=False,
        trust_env=True,
        verify=tls.ssl_context() if tls is not None else True,
    )


class Exchange:
    """Trace of one request (pass it as `extensions={"trace": exchange}`)."""

    __slots__ = ("headers_sent", "new_connection", "response_started", "sent", "used")

    def __init__(self) -> None:
        self.used = False  # a connection took the request (no trace: a mock transport)
        self.new_connection = False
        self.headers_sent = False
        self.sent = False
        self.response_started = False

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith(".connect_tcp.started"):
            self.new_connection = True
        elif event.endswith(".start_tls.complete"):
            # Through a proxy the CONNECT request is traced too: start over after it.
            self.headers_sent = self.sent = self.response_started = False
        elif event.endswith(".send_request_headers.started"):
            self.used = True
        elif event.endswith(".send_request_headers.complete"):
            self.headers_sent = True
        elif event.endswith(".send_request_body.complete"):
            self.sent = True
        elif event.endswith(".receive_response_headers.complete"):
            self.response_started = True

    @property
    def extensions(self) -> dict[str, Any]:
        return {"trace": self}

    def unsent(self, exc: httpx.TransportError, *, streamed: bool = False) -> bool:
        """Whether the request provably never reached the server whole, so it cannot have
        taken effect (a server acts on a request only once it has all of it). A streamed
        body (an S2S session) is acted on as it arrives: then only its headers count."""
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            return True
        if not self.used or self.response_started:
            return False
        return not self.headers_sent if streamed else not self.sent

    def stale(self, exc: httpx.TransportError) -> bool:
        """Whether a pooled connection turned out dead: it was reused, and it broke before
        any response arrived (not a timeout: a slow server is no dead connection)."""
        return (
            self.used
            and not self.new_connection
            and not self.response_started
            and isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError)
        )


def failure_summary(exc: BaseException) -> str:
    """The exception's type and text, short (httpx's texts hold no URL or header)."""
    text = str(exc).strip()
    kind = type(exc).__name__
    return f"{kind}: {text[:200]}" if text else kind


def transport_error(
    exc: httpx.TransportError,
    exchange: Exchange | None,
    target: str,
    what: str,
    retryable: type[ServiceError],
    *,
    streamed: bool = False,
) -> ServiceError:
    """A transport failure as a typed error: `TlsError` when TLS is misconfigured (not
    retryable), else `retryable(...)` carrying `unsent` and `stale_connection`."""
    host = _host(exc)
    problem = tls_problem(exc)
    if problem is not None and problem.kind == "verify":
        return TlsError(
            f"TLS with {host} ({target}) failed: the server's certificate is not trusted "
            f"({problem.reason}). For a private CA, point option sslCaFile "
            "(TlsConfig.ca_file) at a PEM bundle holding it, readable on every node, or set "
            "SSL_CERT_FILE",
            code="tls_verify_failed",
        )
    if problem is not None:
        return TlsError(
            f"TLS with {host} ({target}) failed: the handshake was refused ({problem.reason}). "
            "If the server requires a client certificate, set options sslCertFile and "
            "sslKeyFile (TlsConfig.cert_file, key_file); if it does not speak TLS, use an "
            "http:// URL",
            code="tls_handshake_failed",
        )
    err = retryable(
        f"{what} for {target} failed in transit ({failure_summary(exc)}); the server may be "
        "down or unreachable: check the endpoint and retry",
        status=0,
        code=_transport_code(exc),
    )
    if exchange is None:
        err.unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout
                                | httpx.PoolTimeout)
    else:
        err.unsent = exchange.unsent(exc, streamed=streamed)
        err.stale_connection = exchange.stale(exc)
    return err


def _host(exc: httpx.TransportError) -> str:
    try:
        return exc.request.url.host or "the server"
    except RuntimeError:  # no request attached
        return "the server"


def _transport_code(exc: Exception) -> str:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "connect_failed"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "transport"
