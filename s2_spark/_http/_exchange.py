"""What one request did on the wire, and a transport failure as a typed error.

* `Exchange`: from httpcore's trace events, whether a request went out on a pooled
  connection, was sent completely, got a response. After a transport failure that tells
  whether the request cannot have taken effect (`unsent`) and whether the pooled
  connection was already dead (`stale`: closed by the server, a proxy or a load balancer
  while idle), which is no failure of the service at all.
* `transport_error`: a transport failure as a typed error, TLS problems told apart.
"""

from __future__ import annotations

from typing import Any

import httpx

from s2_spark._tls import tls_problem
from s2_spark.errors import ServiceError, TlsError

__all__ = ["Exchange", "failure_summary", "transport_error"]

#: The step of each httpcore trace event an `Exchange` follows, by the event's full name
#: (its layer, then what happened: "http11.send_request_headers.started").
_STEPS = {
    f"{layer}.{event}": step
    for layer in ("connection", "http11", "http2", "proxy")
    for event, step in (
        ("connect_tcp.started", "new_connection"),
        ("start_tls.complete", "tls"),
        ("send_request_headers.started", "used"),
        ("send_request_headers.complete", "headers_sent"),
        ("send_request_body.complete", "sent"),
        ("receive_response_headers.complete", "response_started"),
    )
}


class Exchange:
    """What one request did on the wire: give it to `HttpClient.send` as `trace`.

    `traced` (the default) follows httpcore's trace events, which is what telling an
    unsent request apart needs (an append that may not be repeated unless it never
    left). Untraced, the client only notes whether the request met a new connection and
    whether a response began: enough to know a dead pooled connection (`stale`), at a
    fraction of the cost (a small request sends ten trace events). Then `unsent` holds
    only for failures to connect.
    """

    __slots__ = ("headers_sent", "new_connection", "response_started", "sent", "traced",
                 "used")

    def __init__(self, *, traced: bool = True) -> None:
        self.traced = traced
        self.used = False  # a connection took the request (no trace: a mock transport)
        self.new_connection = False
        self.headers_sent = False
        self.sent = False
        self.response_started = False

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        step = _STEPS.get(event)
        if step is None:
            return
        if step == "tls":
            # Through a proxy the CONNECT request is traced too: start over after it.
            self.headers_sent = self.sent = self.response_started = False
        else:
            setattr(self, step, True)

    @property
    def extensions(self) -> dict[str, Any]:
        return {"trace": self}

    def unsent(self, exc: httpx.TransportError, *, streamed: bool = False) -> bool:
        """Whether the request provably never reached the server whole, so it cannot have
        taken effect (a server acts on a request only once it has all of it). A streamed
        body (an S2S session) is acted on as it arrives: then only its headers count."""
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            return True
        if not self.traced or not self.used or self.response_started:
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
