"""One httpx client per S2Client, plus the retry loop every unary call goes through.

Sessions and unary calls share the connection pool over HTTP/1.1 (httpx's fastest path).
The Authorization header is attached per request and never logged or quoted in errors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

import httpx

from s2_spark._http import Exchange, http_client
from s2_spark.errors import S2Error, ServiceError, UnavailableError
from s2_spark.retry import RetryLoop, RetryPolicy

from ._config import S2Config
from ._errors import error_from_body, error_from_transport

__all__ = ["Transport", "side_effect_free"]

log = logging.getLogger("s2_spark.client")

# When a failed attempt may have taken effect: "always" (reads, idempotent writes),
# "unsent" (only when the request provably never reached the server), "never".
RetryMode = Literal["always", "unsent", "never"]

#: Keeps the usable prefix of a body cut short in transit (None: nothing usable).
Salvage = Callable[[bytes], bytes | None]

_USER_AGENT = "s2-spark/0.1 (httpx)"
_FRAMING_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def side_effect_free(err: S2Error) -> bool:
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
        self.http = http_client(
            timeout=self.timeout(),
            headers={"user-agent": _USER_AGENT},
            tls=config.tls,
        )

    def __reduce__(self) -> tuple[type[Transport], tuple[S2Config]]:
        # Picklable (Spark ships readers to executors): a copy opens its own connections.
        return (Transport, (self.config,))

    def close(self) -> None:
        self.http.close()

    def timeout(self, read: float | None = None) -> httpx.Timeout:
        cfg = self.config
        return httpx.Timeout(
            connect=cfg.connect_timeout,
            read=cfg.request_timeout if read is None else read,
            write=cfg.request_timeout,
            pool=cfg.request_timeout,
        )

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
        on_retry: Callable[[ServiceError], None] | None = None,
        extra_read_time: float = 0.0,
        salvage: Salvage | None = None,
        policy: RetryPolicy | None = None,
    ) -> httpx.Response:
        """Send one request, retrying retryable failures; return a successful response.

        `retry` says when a failed attempt may be repeated without risking a duplicate.
        `extra_read_time` extends the read timeout (a long-poll read waits server-side).
        `salvage`: a successful answer whose body is cut short in transit is returned with
        the prefix it keeps, instead of being asked for again (when it keeps anything).
        `policy` overrides the config's retry policy for this call.
        """
        url = self.url(basin, path)
        hdrs = self.headers(basin, headers)
        timeout = self.timeout(self.config.request_timeout + extra_read_time)
        loop = RetryLoop(policy or self.config.retry, f"{method} {target}")
        while True:
            outcome = self._attempt(method, url, target, ok, salvage, params=params, json=json,
                                    content=content, headers=hdrs, timeout=timeout)
            if isinstance(outcome, httpx.Response):
                return outcome
            err = outcome
            if err.retryable and retry == "unsent" and not err.unsent:
                raise _ambiguous(err) from err
            if retry == "never":
                raise err
            if on_retry is not None:
                on_retry(err)
            loop.failed(err)

    def _attempt(
        self,
        method: str,
        url: str,
        target: str,
        ok: Callable[[int], bool],
        salvage: Salvage | None,
        **kwargs: Any,
    ) -> httpx.Response | ServiceError:
        """One try: the response, or the error it failed with (marked unsent/stale)."""
        exchange = Exchange()
        try:
            with self.http.stream(method, url, extensions=exchange.extensions, **kwargs) as resp:
                if not ok(resp.status_code):
                    err = error_from_body(resp.status_code, resp.read(), target)
                    err.unsent = side_effect_free(err)
                    return err
                if salvage is None:
                    resp.read()
                    return resp
                return _salvaged(resp, salvage)
        except httpx.TransportError as exc:
            err2 = error_from_transport(exc, target, f"{method} request", exchange)
            err2.__cause__ = exc
            return err2


def _salvaged(resp: httpx.Response, salvage: Salvage) -> httpx.Response:
    """The whole body, or the prefix `salvage` keeps of a body cut short in transit."""
    chunks: list[bytes] = []
    try:
        for chunk in resp.iter_bytes():
            chunks.append(chunk)
        body = b"".join(chunks)
    except httpx.TransportError:
        kept = salvage(b"".join(chunks))
        if kept is None:
            raise
        log.debug("kept %d bytes of an answer cut short in transit", len(kept))
        body = kept
    headers = [(k, v) for k, v in resp.headers.items() if k.lower() not in _FRAMING_HEADERS]
    return httpx.Response(resp.status_code, headers=headers, content=body,
                          request=resp.request)


def _ambiguous(err: ServiceError) -> ServiceError:
    """A failed append that may have landed: say why it was not retried."""
    return UnavailableError(
        f"{err.message}. The append may or may not have been applied, so it was not "
        "retried automatically (that could duplicate records); check the stream's tail, or "
        "append with match_seq_num to make retries safe",
        status=err.status,
        code=err.code,
    )
