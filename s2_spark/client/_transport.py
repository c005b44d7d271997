"""One httpx client per S2Client, plus the retry loop every unary call goes through.

Sessions and unary calls share the connection pool over HTTP/1.1 (httpx's fastest path).
The Authorization header is attached per request and never logged or quoted in errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import httpx

from s2_spark.errors import S2Error, UnavailableError

from ._config import S2Config
from ._errors import error_from_body, error_from_transport

__all__ = ["Transport"]

log = logging.getLogger("s2_spark.client")

# When a failed attempt may have taken effect: "always" (reads, idempotent writes),
# "unsent" (only when the request provably never reached the server), "never".
RetryMode = Literal["always", "unsent", "never"]

_USER_AGENT = "s2-spark/0.1 (httpx)"


def is_unsent(exc: BaseException) -> bool:
    """Whether a transport failure happened before any request byte was sent."""
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)


def _side_effect_free(err: S2Error) -> bool:
    """Statuses S2 promises carry no side effect (rate limiting, hot server, unavailable)."""
    return (
        (err.status == 429)
        or (err.status == 502 and err.code == "hot_server")
        or (err.status == 503 and err.code == "unavailable")
    )


class Transport:
    """Builds requests for account and basin endpoints and retries them per the policy."""

    def __init__(self, config: S2Config) -> None:
        self.config = config
        timeout = httpx.Timeout(
            connect=config.connect_timeout,
            read=config.request_timeout,
            write=config.request_timeout,
            pool=config.request_timeout,
        )
        self.http = httpx.Client(
            timeout=timeout,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            headers={"user-agent": _USER_AGENT},
            follow_redirects=False,
            trust_env=False,
        )

    def __reduce__(self) -> tuple[type[Transport], tuple[S2Config]]:
        # Picklable (Spark ships readers to executors): a copy opens its own connections.
        return (Transport, (self.config,))

    def close(self) -> None:
        self.http.close()

    def headers(self, basin: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.config.access_token:
            out["authorization"] = f"Bearer {self.config.access_token}"
        if basin is not None:
            _, needs_header = self.config.basin_base_url(basin)
            if needs_header:
                out["s2-basin"] = basin
        if extra:
            out.update(extra)
        return out

    def url(self, basin: str | None, path: str) -> str:
        if basin is None:
            return self.config.account_base_url() + path
        base, _ = self.config.basin_base_url(basin)
        return base + path

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
        headers: Mapping[str, str] | None = None,
        retry: RetryMode = "always",
        ok: Callable[[int], bool] = lambda s: 200 <= s < 300,
        on_retry: Callable[[S2Error, bool], None] | None = None,
        extra_read_time: float = 0.0,
    ) -> httpx.Response:
        """Send one request, retrying retryable failures; return a successful response.

        `retry` says when a failed attempt may be repeated without risking a duplicate.
        `extra_read_time` extends the read timeout (a long-poll read waits server-side).
        """
        policy = self.config.retry
        url = self.url(basin, path)
        hdrs = self.headers(basin, headers)
        timeout: Any = httpx.USE_CLIENT_DEFAULT
        if extra_read_time:
            cfg = self.config
            timeout = httpx.Timeout(
                connect=cfg.connect_timeout,
                read=cfg.request_timeout + extra_read_time,
                write=cfg.request_timeout,
                pool=cfg.request_timeout,
            )
        attempt = 0
        while True:
            err: S2Error
            unsent = False
            try:
                resp = self.http.request(
                    method,
                    url,
                    params=params,
                    json=json,
                    content=content,
                    headers=hdrs,
                    timeout=timeout,
                )
            except httpx.TransportError as exc:
                unsent = is_unsent(exc)
                err = error_from_transport(exc, target, f"{method} request")
                err.__cause__ = exc
            else:
                if ok(resp.status_code):
                    return resp
                err = error_from_body(resp.status_code, resp.content, target)
                unsent = _side_effect_free(err)
            may_retry = err.retryable and (retry == "always" or (retry == "unsent" and unsent))
            attempt += 1
            if not may_retry or attempt >= policy.max_attempts:
                if err.retryable and retry == "unsent" and not unsent:
                    raise UnavailableError(
                        f"{err.message}. The append may or may not have been applied, so it "
                        "was not retried automatically (that could duplicate records); check "
                        "the stream's tail, or append with match_seq_num to make retries safe",
                        status=err.status,
                        code=err.code,
                    ) from err
                raise err
            delay = policy.backoff(attempt - 1)
            log.debug(
                "retrying %s %s after %s (attempt %d, %.3fs)",
                method,
                target,
                type(err).__name__,
                attempt,
                delay,
            )
            if on_retry is not None:
                on_retry(err, unsent)
            time.sleep(delay)
