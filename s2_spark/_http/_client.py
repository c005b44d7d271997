"""The HTTP seam both protocol clients send through: requests built once per origin and
handed straight to httpcore's connection pools, the transport under httpx.

httpx's `Client` merges URLs, headers and cookies, runs auth and redirect flows and
builds rich request and response objects on every call: about half the client CPU of a
small request (a tail lookup, a one-record read or append, a long-poll). The protocol
clients need none of it: their origins, headers and timeouts are known up front. So they
name an `Origin` once, keep their header lists, and send through `HttpClient` (threads)
or `AsyncHttpClient` (the tail watch's event loop), which keep what httpx would:

* proxies from the environment, chosen once per origin (`_routes`), CONNECT for https;
* TLS with the system of `s2_spark._tls` (private CAs, client certificates);
* httpcore's trace events for `Exchange`, and httpx's exception types, so failures are
  told apart exactly as before (`transport_error`);
* bodies decoded per Content-Encoding (by `Response`, as on every path of the seam).

`network`, an httpx transport, replaces the pools (tests use `httpx.MockTransport`).
"""

from __future__ import annotations

import itertools
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast
from urllib.parse import quote, urlsplit

import httpcore
import httpx

from s2_spark._tls import TlsConfig, ssl_context_for

from ._exchange import Exchange
from ._response import MAX_BODY_BYTES, BodyTooLargeError, Response, content_encoding
from ._routes import PoolLimits, Route, route_for
from ._streamed_get import StreamedGets

__all__ = [
    "HttpClient",
    "Origin",
    "encode_headers",
    "partial_body",
    "query",
    "split_url",
    "timeouts",
]

Headers = list[tuple[bytes, bytes]]
Timeouts = dict[str, float | None]

#: httpcore's exceptions and the httpx ones callers know (most specific first).
_MAPPED: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


def timeouts(*, connect: float, read: float | None, write: float,
             pool: float | None) -> Timeouts:
    """A request's timeouts in seconds, as httpcore takes them (None: no limit)."""
    return {"connect": connect, "read": read, "write": write, "pool": pool}


@dataclass(frozen=True, eq=False)
class Origin:
    """Where requests to one base URL go: scheme, host, port, the path they all start with
    (`prefix`), the Host header, and the pools of the route to it (one per `POOL_SHARDS`
    share of the threads)."""

    base_url: str
    scheme: bytes
    host: bytes
    port: int
    prefix: bytes
    host_header: bytes
    pools: tuple[Any, ...] = field(repr=False)
    direct: bool = False  # no proxy on its route

    @property
    def pool(self) -> Any:
        """This thread's pool."""
        return self.pools[_THREAD.shard]

    def url(self, target: bytes) -> httpcore.URL:
        return httpcore.URL(scheme=self.scheme, host=self.host, port=self.port,
                            target=self.prefix + target)


def encode_headers(headers: Mapping[str, str]) -> Headers:
    """Header pairs as the seam sends them."""
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def query(params: Mapping[str, Any] | None, *, after: str = "") -> str:
    """`?a=1&b=x` (values percent-encoded; "&..." when `after` has a query already), or
    "" without parameters."""
    if not params:
        return ""
    pairs = (f"{k}={v}" if type(v) is int else f"{quote(k, safe='')}={quote(str(v), safe='')}"
             for k, v in params.items())
    return ("&" if "?" in after else "?") + "&".join(pairs)


def split_url(url: str) -> tuple[str, str]:
    """`url` as its origin ("scheme://host:port") and the rest (path and query)."""
    parts = urlsplit(url)
    rest = parts.path or "/"
    if parts.query:
        rest += "?" + parts.query
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}", rest


def _split(base_url: str) -> tuple[str, str, int, str, str]:
    """(scheme, host, port, path prefix, Host header) of an http(s) base URL."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http:// or https:// URL: {base_url!r}")
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    shown = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    host_header = shown if port == default else f"{shown}:{port}"
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/"), host_header


#: Pools per route: each thread keeps to one (round robin). httpcore takes a pool-wide
#: lock and looks at every pooled connection on each request and response: 32 threads of
#: a writer on one pool spent more time waiting for that lock than on their requests.
POOL_SHARDS = 8
_NEXT_SHARD = itertools.count()


class _ThreadState(threading.local):
    """This thread's pool shard, and the connections it has opened (see
    `_CountingBackend`)."""

    def __init__(self) -> None:
        self.shard = next(_NEXT_SHARD) % POOL_SHARDS
        self.count = 0


_THREAD = _ThreadState()
#: Failures of a request that a connection had taken (not connect or pool failures).
_CONNECTION_FAILURES = (httpcore.ReadError, httpcore.WriteError, httpcore.RemoteProtocolError,
                        httpcore.ReadTimeout, httpcore.WriteTimeout)


#: The most a connection reads from its socket at once (see `_GrowingReads`).
MAX_READ = 1 << 20
#: Writes longer than this go to httpcore as a view (see `_GrowingReads.write`).
_VIEW_WRITES = 1 << 16


class _CountingBackend(httpcore.SyncBackend):
    """Counts the connections each thread opens: a request that failed without opening
    one failed on a pooled connection (what an untraced `Exchange` needs to know); and
    reads them in growing pieces (`_GrowingReads`)."""

    def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        _THREAD.count += 1
        return _GrowingReads(super().connect_tcp(*args, **kwargs))


class _GrowingReads(httpcore.NetworkStream):
    """A connection whose socket reads grow from httpcore's 64 KiB to `MAX_READ` while
    each one comes back at least half full (a streamed body arriving faster than it is
    read: a catch-up read of 100 B records spent a third of its client CPU per 64 KiB
    read), and shrink back at once when one does not: a small answer never pays for a
    large buffer (CPython allocates the whole size for each read)."""

    __slots__ = ("_size", "_stream")

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        self._size = 0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        size = max(max_bytes, self._size)
        data = self._stream.read(size, timeout)
        if len(data) * 2 >= size:
            self._size = min(size * 4, MAX_READ)
        elif len(data) < max_bytes:
            self._size = 0
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # httpcore sends what is left as `buffer[n:]` after each partial send: for bytes,
        # a copy of the rest every time the socket takes part of a large body (an append
        # session's 4 MiB went through memmove several times); a view's slices copy
        # nothing.
        if len(buffer) > _VIEW_WRITES:
            buffer = cast(bytes, memoryview(buffer))  # httpcore only slices and sends it
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _GrowingReads(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _Request(httpcore.Request):
    """An httpcore request from parts that are valid by construction (bytes from the
    origin and the protocol clients' own header lists): httpcore's constructor checks
    every header with `isinstance` against `typing` aliases, a tenth of a small
    request's client CPU."""

    def __init__(self, method: bytes, url: httpcore.URL, headers: Headers, content: bytes,
                 extensions: dict[str, Any]) -> None:
        self.method = method
        self.url = url
        self.headers = headers
        self.stream = _Body(content)
        self.extensions = extensions


class _Body:
    """A request body sent whole."""

    __slots__ = ("_content",)

    def __init__(self, content: bytes) -> None:
        self._content = content

    def __iter__(self) -> Iterator[bytes]:
        if self._content:
            yield self._content



def _reraise(exc: Exception, request: httpcore.Request,
             partial: bytes | None = None) -> NoReturn:
    """Raise an httpcore failure as the httpx exception of its kind (others as they are).
    `partial`: the body that arrived before the failure, kept on the exception for
    callers that can use a prefix (an unencoded body only)."""
    failure: Exception = exc
    for core, mapped in _MAPPED:
        if isinstance(exc, core):
            failure = mapped(str(exc), request=httpx.Request(request.method.decode(),
                                                             _text(request.url)))
            break
    if partial is not None and isinstance(failure, httpx.TransportError):
        failure.partial = partial  # type: ignore[attr-defined]
    if failure is exc:
        raise exc
    raise failure from exc


def partial_body(exc: httpx.TransportError) -> bytes | None:
    """What arrived of a successful answer's body before `exc` cut it short, or None."""
    return getattr(exc, "partial", None)


def _text(url: httpcore.URL) -> str:
    return f"{url.scheme.decode()}://{url.host.decode()}:{url.port}{url.target.decode()}"


def _read_whole(status: int, chunks: Iterable[bytes], raw_headers: Headers,
                request: httpcore.Request, close: Callable[[], object], max_body: int) -> bytes:
    """The whole body, as it came (`Response` decodes it); a longer one than `max_body`
    fails (`BodyTooLargeError`, not retried). A failure of a successful (2xx) answer
    keeps the prefix that arrived (`partial_body`), when the body is not encoded."""
    got: list[bytes] = []
    size = 0
    try:
        for chunk in chunks:
            got.append(chunk)
            size += len(chunk)
            if size > max_body:
                break
    except Exception as exc:
        keep = 200 <= status < 300 and not content_encoding(raw_headers)
        _reraise(exc, request, b"".join(got) if keep else None)
    finally:
        close()
    if size > max_body:
        got.clear()  # not kept alive by the error's traceback
        raise BodyTooLargeError(max_body, status=status)
    return b"".join(got)


class HttpClient:
    """Sends requests from any thread; `close()` closes every connection."""

    def __init__(self, *, tls: TlsConfig | None = None, limits: PoolLimits | None = None,
                 network: httpx.BaseTransport | None = None) -> None:
        self._tls = tls
        self._limits = limits or PoolLimits()
        self._network = network
        self._ssl: ssl.SSLContext | None = None
        self._pools: dict[tuple[Route, bool], tuple[Any, ...]] = {}
        self._origins: dict[str, Origin] = {}
        self._lock = threading.Lock()
        self._gets = StreamedGets(self.ssl_context)

    def origin(self, base_url: str) -> Origin:
        """The origin of `base_url` (made once; its route is fixed from then on)."""
        found = self._origins.get(base_url)
        if found is not None:
            return found
        scheme, host, port, prefix, host_header = _split(base_url)
        route = route_for(scheme, host, port)
        with self._lock:
            tls = scheme == "https" or (route.proxy or "").startswith("https:")
            pools = self._pools.get((route, tls), ())
            if not pools and self._network is None:
                ssl_context = self.ssl_context() if tls else None
                pools = self._pools[(route, tls)] = tuple(
                    route.pool(ssl_context, self._limits, backend=_CountingBackend())
                    for _ in range(POOL_SHARDS))
            origin = self._origins[base_url] = Origin(
                base_url, scheme.encode(), host.encode(), port, prefix.encode(),
                host_header.encode(), pools, route.proxy is None)
        return origin

    def ssl_context(self) -> ssl.SSLContext:
        """The context this client verifies servers with (made on first use)."""
        if self._ssl is None:
            self._ssl = ssl_context_for(self._tls)
        return self._ssl

    def _request(self, method: bytes, origin: Origin, target: bytes, headers: Headers,
                 content: bytes | None, timeout: Timeouts, trace: Any) -> httpcore.Request:
        head = [(b"host", origin.host_header), *headers]
        if content is not None:
            head.append((b"content-length", b"%d" % len(content)))
        ext: dict[str, Any] = {"timeout": timeout}
        if trace is not None:
            ext["trace"] = trace
        return _Request(method, origin.url(target), head, content or b"", ext)

    def send(self, method: bytes, origin: Origin, target: bytes, headers: Headers, *,
             content: bytes | None = None, timeout: Timeouts, trace: Exchange | None = None,
             stream: bool = False, views: bool = False,
             max_body: int = MAX_BODY_BYTES) -> Response:
        """Send one request; the response is read whole (at most `max_body` bytes of it)
        unless `stream`. `headers` are
        sent as they are after Host (and Content-Length for a body). `trace` notes what
        the request did (see `Exchange`). `views`: a streamed GET's chunks may be
        memoryviews (each valid for as long as it is held), read off a socket of its own
        where the route is direct (`StreamedGets`: a long body's client CPU halves)."""
        if views and stream and method == b"GET" and origin.direct and self._network is None:
            return self._gets.get(origin.scheme.decode(), origin.host.decode(), origin.port,
                                  origin.prefix + target,
                                  [(b"host", origin.host_header), *headers],
                                  timeout=timeout, trace=trace)
        traced = trace if trace is not None and trace.traced else None
        request = self._request(method, origin, target, headers, content, timeout, traced)
        if self._network is not None:
            return self._via_network(request, stream, max_body)
        connects = _THREAD.count
        try:
            resp = origin.pool.handle_request(request)
        except Exception as exc:
            if trace is not None and traced is None:
                trace.used = isinstance(exc, _CONNECTION_FAILURES)
                trace.new_connection = _THREAD.count != connects
            _reraise(exc, request)
        if trace is not None:
            trace.response_started = True
        if stream:
            return Response(resp.status, resp.headers, chunks=self._chunks(resp, request),
                            close=resp.close)
        return Response(resp.status, resp.headers, content=_read_whole(
            resp.status, resp.iter_stream(), resp.headers, request, resp.close, max_body),
            limit=max_body)

    @staticmethod
    def _chunks(resp: httpcore.Response, request: httpcore.Request) -> Iterator[bytes]:
        try:
            yield from resp.iter_stream()
        except Exception as exc:
            _reraise(exc, request)
        finally:
            resp.close()

    def _via_network(self, request: httpcore.Request, stream: bool, max_body: int) -> Response:
        """Through the httpx transport that replaces the pools."""
        assert self._network is not None
        sent = httpx.Request(
            request.method.decode(), _text(request.url), headers=request.headers,
            content=b"".join(request.stream),  # type: ignore[arg-type]
            extensions=request.extensions)
        resp = self._network.handle_request(sent)
        chunks = iter(resp.stream)  # type: ignore[arg-type]
        if stream:
            return Response(resp.status_code, resp.headers.raw, chunks=chunks, close=resp.close)
        return Response(resp.status_code, resp.headers.raw, content=_read_whole(
            resp.status_code, chunks, resp.headers.raw, request, resp.close, max_body),
            limit=max_body)

    def close(self) -> None:
        with self._lock:
            pools = [p for shards in self._pools.values() for p in shards]
            self._pools = {}
            self._origins.clear()
        for pool in pools:
            pool.close()
        self._gets.close()
        if self._network is not None:
            self._network.close()
