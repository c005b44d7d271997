"""One httpx client per DurableStreamsClient and the retry loop unary requests go through."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import httpx

from s2_spark._http import Exchange, http_client
from s2_spark.errors import ServiceError
from s2_spark.retry import RetryLoop

from ._config import DurableConfig
from ._errors import error_from_response, error_from_transport

__all__ = ["RetryMode", "Transport"]

# When a failed attempt may be repeated: "always" (reads, idempotent writes), "unsent"
# (only when the request provably never reached the server or was refused), "never".
RetryMode = Literal["always", "unsent", "never"]

_USER_AGENT = "s2-spark/0.1 (httpx; durable-streams)"


class Transport:
    """Sends requests to stream URLs with the config's headers, timeouts and retries."""

    def __init__(
        self, config: DurableConfig, http_transport: httpx.BaseTransport | None = None
    ) -> None:
        self.config = config
        self.http = http_client(
            timeout=self.timeout(config.request_timeout),
            headers={"user-agent": _USER_AGENT, **config.headers},
            tls=config.tls,
            transport=http_transport,
        )

    def __reduce__(self) -> tuple[type[Transport], tuple[DurableConfig]]:
        # Picklable (Spark ships readers to executors): a copy opens its own connections.
        return (Transport, (self.config,))

    def timeout(self, read: float) -> httpx.Timeout:
        cfg = self.config
        return httpx.Timeout(
            connect=cfg.connect_timeout, read=read, write=cfg.request_timeout, pool=read
        )

    def close(self) -> None:
        self.http.close()

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
    ) -> httpx.Response:
        """Send one request, retrying retryable failures that `retry` allows."""
        loop = RetryLoop(self.config.retry, f"{method} {target}")
        timeout = self.timeout(read_timeout or self.config.request_timeout)
        while True:
            err: ServiceError
            exchange = Exchange()
            try:
                resp = self.http.request(
                    method,
                    url,
                    headers=headers,
                    content=content,
                    params=params,
                    timeout=timeout,
                    extensions=exchange.extensions,
                )
            except httpx.TransportError as exc:
                err = error_from_transport(exc, target, f"{method} request", exchange)
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
        params: Mapping[str, Any],
        headers: Mapping[str, str],
        read: float,
        exchange: Exchange,
    ) -> Any:
        """A streaming GET (the caller enters it as a context manager), traced by
        `exchange`."""
        return self.http.stream(
            "GET", url, params=params, headers=headers, timeout=self.timeout(read),
            extensions=exchange.extensions,
        )
