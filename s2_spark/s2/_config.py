"""Client configuration: endpoints, credentials, timeouts and the retry policy.

The access token and the encryption key live only here and in the headers built from
them; the dataclass repr hides both so that logging a config (or an object holding one)
is safe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal
from urllib.parse import urlsplit

from s2_spark._encryption_key import check_encryption_key
from s2_spark._tls import TlsConfig
from s2_spark.retry import RetryPolicy

__all__ = [
    "DEFAULT_ACCOUNT_ENDPOINT",
    "DEFAULT_BASIN_ENDPOINT",
    "RetryPolicy",
    "S2Config",
    "TlsConfig",
]

#: Fields repr shows as '***'.
_SECRETS = frozenset({"access_token", "encryption_key"})
_ACCEPT_ENCODING = {"zstd": "zstd, gzip", "gzip": "gzip", "none": "identity"}
DEFAULT_ACCOUNT_ENDPOINT = "https://a.s2.dev"
DEFAULT_BASIN_ENDPOINT = "https://{basin}.b.s2.dev"


def _check_timeout(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"S2Config.{name} must be a number of seconds > 0 (got {value!r})")


def _check_url(name: str, value: str | None) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ValueError(f"S2Config.{name} must be an http:// or https:// URL (got {value!r})")


@dataclass(frozen=True, slots=True)
class S2Config:
    """Where and how to reach S2.

    * `endpoint`: one URL serving account and basin operations (s2-lite, the local test
      server); the basin goes in the `S2-Basin` header and paths live under `/v1`.
    * otherwise S2 cloud: `account_endpoint` (default https://a.s2.dev) and
      `basin_endpoint` (default https://{basin}.b.s2.dev; "{basin}" is substituted, and
      without it the basin is sent in the `S2-Basin` header).
    * `session_idle_timeout`: seconds a read session may stay silent (no records, no
      heartbeat) before it counts as dead and is reopened. S2 sends a heartbeat after a
      random 5-15 s while a session waits at the tail (s2-lite `lite/src/backend/read.rs`),
      so keep it above 15 s; the default, 20 s, is.
    * `retry`: how transient failures are retried (until `retry.timeout` seconds pass
      without progress; 120 s by default).
    * `tls`: a private CA bundle or a client certificate (`TlsConfig`); by default the
      CAs httpx trusts, `SSL_CERT_FILE` / `SSL_CERT_DIR` when set. Proxies come from
      `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY`.
    * `encryption_key`: the key of the basin's encrypted streams (those created while its
      `stream_cipher` was set), base64 of 32 bytes, sent with every request to the basin
      (S2 reads it on appends and reads; a stream without a cipher ignores it). S2 checks
      it only when reading: records appended with another key fail to decrypt then
      (`EncryptionKeyError`). Hidden from repr like the token.
    * `compression`: what every request asks S2 to compress with, and compresses with
      itself: its Accept-Encoding (S2 compresses answers of 1 KiB or more, and the
      frames of S2S sessions, with it), the frames of append sessions, and unary request
      bodies of 1 KiB or more (as S2's SDKs do). "zstd" (gzip where a server has no zstd)
      or "gzip" save bandwidth to S2 cloud; on loopback they only cost CPU on both ends
      (a 1M-record catch-up read ran ~5x slower with zstd). "auto" (default): none for
      a loopback endpoint (localhost, 127.x, ::1), zstd otherwise.
    """

    access_token: str | None = field(default=None, repr=False)
    endpoint: str | None = None
    account_endpoint: str | None = None
    basin_endpoint: str | None = None
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    session_idle_timeout: float = 20.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    compression: Literal["auto", "zstd", "gzip", "none"] = "auto"
    tls: TlsConfig | None = None
    encryption_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.compression not in ("auto", "zstd", "gzip", "none"):
            raise ValueError(
                "S2Config.compression must be 'auto', 'zstd', 'gzip' or 'none' "
                f"(got {self.compression!r})"
            )
        if self.access_token is not None and not isinstance(self.access_token, str):
            raise ValueError("S2Config.access_token must be a string or None")
        if self.access_token is not None and any(c in self.access_token for c in "\r\n"):
            raise ValueError("S2Config.access_token must not contain line breaks")
        for name in ("endpoint", "account_endpoint", "basin_endpoint"):
            _check_url(name, getattr(self, name))
        for name in ("connect_timeout", "request_timeout", "session_idle_timeout"):
            _check_timeout(name, getattr(self, name))
        if not isinstance(self.retry, RetryPolicy):
            raise ValueError(f"S2Config.retry must be a RetryPolicy (got {self.retry!r})")
        if self.tls is not None and not isinstance(self.tls, TlsConfig):
            raise ValueError(f"S2Config.tls must be a TlsConfig or None (got {self.tls!r})")
        if self.encryption_key is not None:
            key = check_encryption_key(self.encryption_key, "S2Config.encryption_key")
            object.__setattr__(self, "encryption_key", key)

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _SECRETS:
                parts.append(f"{f.name}={'None' if value is None else repr('***')}")
            else:
                parts.append(f"{f.name}={value!r}")
        return f"S2Config({', '.join(parts)})"

    @classmethod
    def from_env(cls, **overrides: Any) -> S2Config:
        """Build a config from keyword overrides, falling back to the environment.

        S2_ACCESS_TOKEN, S2_ACCOUNT_ENDPOINT and S2_BASIN_ENDPOINT fill whatever the
        overrides leave unset (None); S2_ENDPOINT fills `endpoint` and S2_ENCRYPTION_KEY
        `encryption_key` likewise.
        """
        env = {
            "access_token": "S2_ACCESS_TOKEN",
            "encryption_key": "S2_ENCRYPTION_KEY",
            "endpoint": "S2_ENDPOINT",
            "account_endpoint": "S2_ACCOUNT_ENDPOINT",
            "basin_endpoint": "S2_BASIN_ENDPOINT",
        }
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(
                f"S2Config.from_env got unknown setting(s) {unknown}; accepted: {sorted(known)}"
            )
        values = {k: v for k, v in overrides.items() if v is not None}
        for name, var in env.items():
            if name not in values:
                value = os.environ.get(var)
                if value:
                    values[name] = value
        # An explicit cloud setting in the overrides wins over an env single endpoint.
        if (
            "endpoint" in values
            and overrides.get("endpoint") is None
            and (overrides.get("account_endpoint") or overrides.get("basin_endpoint"))
        ):
            del values["endpoint"]
        return cls(**values)

    def with_retry(self, retry: RetryPolicy) -> S2Config:
        """A copy with another retry policy."""
        return replace(self, retry=retry)

    def session_compression(self, basin: str | None = None) -> Literal["zstd", "gzip", "none"]:
        """The compression requests to `basin` (None: the account) use, resolving "auto"
        by the endpoint's host."""
        if self.compression != "auto":
            return self.compression
        url = self.basin_base_url(basin)[0] if basin else self.account_base_url()
        host = urlsplit(url).hostname or ""
        loopback = host == "localhost" or host.startswith("127.") or host == "::1"
        return "none" if loopback else "zstd"

    def session_accept_encoding(self, basin: str | None = None) -> str:
        """The Accept-Encoding every request sends: always explicit, since httpx's default
        (gzip) would make the server gzip every answer and frame."""
        return _ACCEPT_ENCODING[self.session_compression(basin)]

    def account_base_url(self) -> str:
        """Base URL (ending in /v1) for account operations."""
        base = self.endpoint or self.account_endpoint or DEFAULT_ACCOUNT_ENDPOINT
        return _v1(base)

    def basin_base_url(self, basin: str) -> tuple[str, bool]:
        """Base URL (ending in /v1) for a basin and whether S2-Basin must be sent."""
        if self.endpoint:
            return _v1(self.endpoint), True
        template = self.basin_endpoint or DEFAULT_BASIN_ENDPOINT
        if "{basin}" in template:
            return _v1(template.replace("{basin}", basin)), False
        return _v1(template), True


def _v1(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"
