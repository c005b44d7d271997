"""One HTTP seam per S2Client, plus the retry loop every unary call goes through.

Sessions and unary calls share the connection pools over HTTP/1.1. Each basin's origin
and headers are built once (`BasinRoute`), so a request costs its own bytes and little
else. The Authorization and `s2-encryption-key` headers are part of each basin's headers,
never logged or quoted in errors.

`S2Config.compression` governs every request alike: its Accept-Encoding (S2 compresses
answers of 1 KiB or more, and S2S frames, with what it names; the seam decodes them),
and the request bodies of 1 KiB or more, sent compressed as S2's own SDKs send theirs
(`BasinRoute.body`; S2S sessions compress their frames instead).
"""

from __future__ import annotations

import json as jsonlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from s2_spark._http import (
    AsyncTimeouts,
    BodyDecodingError,
    Exchange,
    Fanout,
    HttpClient,
    Origin,
    Response,
    encode_headers,
    partial_body,
    query,
    timeouts,
)
from s2_spark.errors import S2UnavailableError, ServiceError
from s2_spark.retry import RetryLoop, RetryPolicy
from s2_spark.wire.frames import COMPRESSION_THRESHOLD, Compression, compress

from ._config import S2Config
from ._errors import error_from_decoding, error_from_response, error_from_transport

__all__ = ["BasinRoute", "Headers", "Transport", "query"]

log = logging.getLogger("s2_spark.s2")

# When a failed attempt may be repeated: "always" (reads, idempotent writes), "unsent"
# (only when it provably had no effect: it never reached the server whole, or S2's
# answer guarantees no side effect, see `_error_codes`), "never".
RetryMode = Literal["always", "unsent", "never"]

#: Keeps the usable prefix of a body cut short in transit (None: nothing usable).
Salvage = Callable[[bytes], bytes | None]
Headers = list[tuple[bytes, bytes]]

_USER_AGENT = b"s2-spark/0.1 (httpx)"
_JSON = [(b"content-type", b"application/json")]


_COMPRESSION = {"zstd": Compression.ZSTD, "gzip": Compression.GZIP, "none": Compression.NONE}


@dataclass(frozen=True, eq=False)
class BasinRoute:
    """Where a basin's (or, for None, the account's) requests go, the headers every one
    of them carries (user agent, credentials, S2-Basin where needed, Accept-Encoding) and
    how their bodies are compressed."""

    origin: Origin
    headers: Headers
    compression: Compression = Compression.NONE

    def __repr__(self) -> str:
        return f"BasinRoute({self.origin.base_url!r})"  # the headers hold the token

    def body(self, content: bytes) -> tuple[bytes, Headers]:
        """A unary request's body as sent, and the header naming its encoding: compressed
        when compression is on and it holds 1 KiB or more (S2's threshold for frames and
        answers: smaller ones gain little for the CPU)."""
        if self.compression is Compression.NONE or len(content) < COMPRESSION_THRESHOLD:
            return content, []
        token = self.compression.token
        assert token is not None
        return compress(self.compression, content), [(b"content-encoding", token.encode())]


class Transport:
    """Builds requests for account and basin endpoints and retries them per the policy."""

    def __init__(self, config: S2Config) -> None:
        self.config = config
        self.http = HttpClient(tls=config.tls)
        self._routes: dict[str | None, BasinRoute] = {}
        self._timeout = self.timeout()
        self._fanout: Fanout | None = None
        self._fanout_lock = threading.Lock()

    def __reduce__(self) -> tuple[type[Transport], tuple[S2Config]]:
        # Picklable (Spark ships readers to executors): a copy opens its own connections.
        return (Transport, (self.config,))

    def close(self) -> None:
        if self._fanout is not None:
            self._fanout.close()
        self.http.close()

    def fanout(self) -> Fanout:
        """The client's fan-out (many small requests at once), started on first use."""
        with self._fanout_lock:
            if self._fanout is None:
                cfg = self.config
                self._fanout = Fanout(self.http.ssl_context, AsyncTimeouts(
                    connect=cfg.connect_timeout, read=cfg.request_timeout))
            return self._fanout

    def timeout(self, read: float | None = None) -> dict[str, float | None]:
        cfg = self.config
        return timeouts(connect=cfg.connect_timeout,
                        read=cfg.request_timeout if read is None else read,
                        write=cfg.request_timeout, pool=cfg.request_timeout)

    def base_url(self, basin: str | None) -> str:
        """The base URL (ending in /v1) of the basin's, or the account's, requests."""
        if basin is None:
            return self.config.account_base_url()
        return self.config.basin_base_url(basin)[0]

    def base_headers(self, basin: str | None) -> Headers:
        """What every request for `basin` (None: the account) carries. The encryption key
        goes with every request to a basin, so no append or read path can leave it out;
        S2 reads it on appends and reads only."""
        out: Headers = [(b"user-agent", _USER_AGENT)]
        if self.config.access_token:
            out.append((b"authorization", f"Bearer {self.config.access_token}".encode()))
        if basin is not None and self.config.basin_base_url(basin)[1]:
            out.append((b"s2-basin", basin.encode()))
        if basin is not None and self.config.encryption_key:
            out.append((b"s2-encryption-key", self.config.encryption_key.encode()))
        # Always explicit (httpx's default would be gzip): S2 compresses answers of 1 KiB or
        # more, and S2S frames, with what it names.
        out.append((b"accept-encoding", self.config.session_accept_encoding(basin).encode()))
        return out

    def route(self, basin: str | None) -> BasinRoute:
        """The basin's route, built on first use."""
        found = self._routes.get(basin)
        if found is None:
            origin = self.http.origin(self.base_url(basin))
            found = self._routes[basin] = BasinRoute(
                origin, self.base_headers(basin),
                _COMPRESSION[self.config.session_compression(basin)])
        return found

    def send(self, method: str, basin: str | None, target: str, headers: Headers, *,
             content: bytes | None = None, timeout: dict[str, float | None] | None = None,
             trace: Exchange | None = None, stream: bool = False,
             views: bool = False) -> Response:
        """One attempt, no retries: `target` is the path (and query) under /v1. `views`:
        see `HttpClient.send`."""
        route = self.route(basin)
        return self.http.send(method.encode(), route.origin, target.encode(),
                              route.headers + headers, content=content,
                              timeout=timeout or self._timeout, trace=trace, stream=stream,
                              views=views)

    def request(
        self,
        method: str,
        path: str,
        *,
        basin: str | None,
        target: str,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | Headers | None = None,
        retry: RetryMode = "always",
        ok: Callable[[int], bool] = lambda s: 200 <= s < 300,
        on_retry: Callable[[ServiceError], None] | None = None,
        extra_read_time: float = 0.0,
        salvage: Salvage | None = None,
        policy: RetryPolicy | None = None,
    ) -> Response:
        """Send one request, retrying retryable failures; return a successful response.

        `retry` says when a failed attempt may be repeated without risking a duplicate.
        `extra_read_time` extends the read timeout (a long-poll read waits server-side).
        `salvage`: a successful answer whose body is cut short in transit is returned with
        the prefix it keeps, instead of being asked for again (when it keeps anything).
        `policy` overrides the config's retry policy for this call.
        """
        hdrs = encode_headers(headers) if isinstance(headers, Mapping) else list(headers or ())
        if json is not None:
            content = jsonlib.dumps(json).encode()
            hdrs += _JSON
        if content is not None:
            content, encoded = self.route(basin).body(content)
            hdrs += encoded
        timeout = self._timeout
        if extra_read_time:
            timeout = self.timeout(self.config.request_timeout + extra_read_time)
        request = _Attempt(self, method, basin, path + query(params), hdrs, content,
                           timeout, target, ok, salvage, traced=retry == "unsent")
        loop: RetryLoop | None = None
        while True:
            outcome = request.run()
            if isinstance(outcome, Response):
                return outcome
            err = outcome
            if err.retryable and retry == "unsent" and not err.unsent:
                raise _ambiguous(err) from err
            if retry == "never":
                raise err
            if on_retry is not None:
                on_retry(err)
            if loop is None:
                loop = RetryLoop(policy or self.config.retry, f"{method} {target}")
            loop.failed(err)


class _Attempt:
    """One request as `Transport.request` sends it, attempt after attempt. `traced`:
    whether `unsent` must be known beyond connect failures (see `Exchange`)."""

    __slots__ = ("basin", "content", "headers", "method", "ok", "path", "salvage", "target",
                 "timeout", "traced", "transport")

    def __init__(self, transport: Transport, method: str, basin: str | None, path: str,
                 headers: Headers, content: bytes | None, timeout: dict[str, float | None],
                 target: str, ok: Callable[[int], bool], salvage: Salvage | None, *,
                 traced: bool) -> None:
        self.transport = transport
        self.method = method
        self.basin = basin
        self.path = path
        self.headers = headers
        self.content = content
        self.timeout = timeout
        self.target = target
        self.ok = ok
        self.salvage = salvage
        self.traced = traced

    def run(self) -> Response | ServiceError:
        """One try: the response, or the error it failed with (marked unsent/stale)."""
        exchange = Exchange(traced=self.traced)
        try:
            resp = self.transport.send(self.method, self.basin, self.path, self.headers,
                                       content=self.content, timeout=self.timeout,
                                       trace=exchange)
        except httpx.TransportError as exc:
            kept = self._salvaged(exc)
            if kept is not None:
                return kept
            err = error_from_transport(exc, self.target, f"{self.method} request", exchange)
            err.__cause__ = exc
            return err
        except BodyDecodingError as exc:
            return error_from_decoding(exc, self.target)
        if not self.ok(resp.status_code):
            return error_from_response(resp, self.target)
        return resp

    def _salvaged(self, exc: httpx.TransportError) -> Response | None:
        """A successful answer cut short in transit, as the prefix `salvage` keeps of it."""
        partial = partial_body(exc)
        if self.salvage is None or partial is None:
            return None
        kept = self.salvage(partial)
        if kept is None:
            return None
        log.debug("kept %d bytes of an answer cut short in transit", len(kept))
        return Response(200, [], content=kept)


def _ambiguous(err: ServiceError) -> ServiceError:
    """A failed append that may have landed: say why it was not retried."""
    return S2UnavailableError(
        f"{err.message}. The append may or may not have been applied, so it was not "
        "retried automatically (that could duplicate records); check the stream's tail, or "
        "append with match_seq_num to make retries safe",
        status=err.status,
        code=err.code,
    )
