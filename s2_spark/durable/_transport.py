"""One HTTP seam per DurableStreamsClient and the retry loop unary requests go through."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import httpx

from s2_spark._http import (
    BodyDecodingError,
    Exchange,
    HttpClient,
    Response,
    encode_headers,
    query,
    split_url,
    timeouts,
)
from s2_spark.errors import ServiceError
from s2_spark.retry import RetryLoop

from ._config import DurableConfig
from ._errors import error_from_decoding, error_from_response, error_from_transport

__all__ = ["RetryMode", "Transport", "query", "split_url"]

# When a failed attempt may be repeated: "always" (reads, idempotent writes), "unsent"
# (only when the request provably never reached the server or was refused), "never".
RetryMode = Literal["always", "unsent", "never"]

_USER_AGENT = "s2-spark/0.1 (httpx; durable-streams)"
Headers = list[tuple[bytes, bytes]]


class Transport:
    """Sends requests to stream URLs with the config's headers, timeouts and retries."""

    def __init__(
        self, config: DurableConfig, http_transport: httpx.BaseTransport | None = None
    ) -> None:
        self.config = config
        self.http = HttpClient(tls=config.tls, network=http_transport)
        self._headers = self.base_headers()

    def __reduce__(self) -> tuple[type[Transport], tuple[DurableConfig]]:
        # Picklable (Spark ships readers to executors): a copy opens its own connections.
        return (Transport, (self.config,))

    def base_headers(self) -> Headers:
        """What every request carries: user agent and the config's own headers."""
        return encode_headers({"user-agent": _USER_AGENT, **self.config.headers})

    def timeout(self, read: float) -> dict[str, float | None]:
        cfg = self.config
        return timeouts(connect=cfg.connect_timeout, read=read, write=cfg.request_timeout,
                        pool=read)

    def close(self) -> None:
        self.http.close()

    def send(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
             params: Mapping[str, str] | None = None, content: bytes | None = None,
             read: float, exchange: Exchange | None = None,
             stream: bool = False) -> Response:
        """One attempt, no retries (`stream`: the caller reads or closes the response)."""
        base, target = split_url(url)
        hdrs = self._headers + encode_headers(headers) if headers else self._headers
        return self.http.send(method.encode(), self.http.origin(base),
                              (target + query(params, after=target)).encode(), hdrs,
                              content=content, timeout=self.timeout(read), trace=exchange,
                              stream=stream, max_body=self.config.max_read_bytes)

    def request(
        self,
        method: str,
        url: str,
        *,
        target: str,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        retry: RetryMode = "always",
        ok: tuple[int, ...] = (200, 201, 204),
        offset: str | None = None,
        read_timeout: float | None = None,
    ) -> Response:
        """Send one request, retrying retryable failures that `retry` allows."""
        loop = RetryLoop(self.config.retry, f"{method} {target}")
        read = read_timeout or self.config.request_timeout
        while True:
            err: ServiceError
            exchange = Exchange(traced=retry != "always")
            try:
                resp = self.send(method, url, headers=headers, params=params, content=content,
                                 read=read, exchange=exchange)
            except httpx.TransportError as exc:
                err = error_from_transport(exc, target, f"{method} request", exchange)
            except BodyDecodingError as exc:
                raise error_from_decoding(exc, target) from exc
            else:
                if resp.status_code in ok:
                    return resp
                err = error_from_response(resp, target, offset)
                err.unsent = resp.status_code == 429
            if retry == "never" or (retry == "unsent" and not err.unsent):
                if err.retryable and method == "POST":
                    err.amend(
                        "; the append may or may not have been applied, so it was not retried "
                        "(that could duplicate data): use an IdempotentProducer for safe retries"
                    )
                raise err
            loop.failed(err)

    def stream(
        self,
        url: str,
        *,
        params: Mapping[str, str],
        headers: Mapping[str, str],
        read: float,
        exchange: Exchange,
    ) -> Response:
        """A streaming GET (the caller enters it as a context manager), traced by
        `exchange`."""
        return self.send("GET", url, params=params, headers=headers, read=read,
                         exchange=exchange, stream=True)
