"""Where a Durable Streams server is and how to talk to it.

Extra request headers (typically `authorization`) are kept out of the repr, so logging a
config or an object holding one cannot leak a token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from s2_spark._tls import TlsConfig
from s2_spark.retry import RetryPolicy
from s2_spark.wire.durable import MAX_SSE_EVENT

__all__ = ["DurableConfig"]


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"DurableConfig.{name} must be a number of seconds > 0 (got {value!r})")


@dataclass(frozen=True, slots=True)
class DurableConfig:
    """Settings of a `DurableStreamsClient`.

    * `base_url`: prefix for relative stream paths (absolute stream URLs need none).
    * `headers`: sent with every request (e.g. {"authorization": "Bearer ..."}); hidden
      from repr and never quoted in errors.
    * `live_timeout`: read timeout of long-poll and SSE requests; must exceed the server's
      long-poll wait (30 s for the reference server) and its SSE keep-alive interval.
    * `retry`: how transient failures are retried (until `retry.timeout` seconds pass
      without progress; 120 s by default).
    * `tls`: a private CA bundle or a client certificate (`TlsConfig`); by default the
      CAs httpx trusts, `SSL_CERT_FILE` / `SSL_CERT_DIR` when set. Proxies come from
      `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY`.
    * `compression`: ask for gzip-compressed reads. Off by default: on loopback and fast
      networks it only costs CPU on both ends.
    * `max_read_bytes`: the most of an answer held at once, in bytes; 64 MiB by default.
      It bounds what is held, not how long a read is: `read()` and `read_pieces()` take
      answers of any length as they arrive and fail only on one message (JSON), one SSE
      event (its lines, and the data events before a control event) or one line over it;
      `get()`, which returns an answer whole, fails on an answer over it. Past it the call
      fails at once, never retried (the server would send the same again), with
      `MalformedResponseError` naming this setting.
    """

    base_url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    live_timeout: float = 75.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    compression: bool = False
    tls: TlsConfig | None = None
    max_read_bytes: int = MAX_SSE_EVENT

    def __post_init__(self) -> None:
        if self.base_url is not None and (
            not isinstance(self.base_url, str)
            or not self.base_url.startswith(("http://", "https://"))
        ):
            raise ValueError(
                f"DurableConfig.base_url must be an http:// or https:// URL (got "
                f"{self.base_url!r})"
            )
        if not isinstance(self.headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and "\n" not in v and "\r" not in v
            for k, v in self.headers.items()
        ):
            raise ValueError(
                "DurableConfig.headers must map header names to strings without line breaks"
            )
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        for name in ("connect_timeout", "request_timeout", "live_timeout"):
            _positive(name, getattr(self, name))
        if not isinstance(self.retry, RetryPolicy):
            raise ValueError(f"DurableConfig.retry must be a RetryPolicy (got {self.retry!r})")
        limit = self.max_read_bytes
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1024:
            raise ValueError("DurableConfig.max_read_bytes must be a number of bytes >= 1024 "
                             f"(got {limit!r})")
        if self.tls is not None and not isinstance(self.tls, TlsConfig):
            raise ValueError(f"DurableConfig.tls must be a TlsConfig or None (got {self.tls!r})")

    def stream_url(self, stream: str) -> str:
        """The absolute URL of a stream given as a URL or as a path under `base_url`."""
        if not isinstance(stream, str) or not stream:
            raise ValueError(f"a stream must be a non-empty URL or path (got {stream!r})")
        if stream.startswith(("http://", "https://")):
            return stream
        if self.base_url is None:
            raise ValueError(
                f"stream {stream!r} is a path but DurableConfig.base_url is not set; pass an "
                "absolute http(s) URL or set base_url"
            )
        return self.base_url.rstrip("/") + "/" + stream.lstrip("/")
