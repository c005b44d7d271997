"""The network options every format shares (no pyspark): how long and how often to retry,
and TLS.

Proxies need no option: both clients honour `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY`
(and `SSL_CERT_FILE` / `SSL_CERT_DIR`) in the environment of each process, driver and
executors alike, as every HTTP client on those machines does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from s2_spark._options import Option
from s2_spark._tls import TlsConfig
from s2_spark.errors import OptionError
from s2_spark.retry import DEFAULT_RETRY_TIMEOUT, RetryPolicy

__all__ = ["NETWORK_OPTIONS", "NetworkSettings", "parse_network_options"]

RETRY_TIMEOUT_MS = Option(
    "retryTimeoutMs", "milliseconds, an integer >= 0",
    "How long a failing request is retried, with backoff and jitter, without progress "
    "(records delivered, appends acknowledged start it over) before the task or plan "
    "fails; 0 turns retries off. Dead pooled connections are retried at once and never "
    "count.",
    default=int(DEFAULT_RETRY_TIMEOUT * 1000),
)
_DEFAULT_POLICY = RetryPolicy()
RETRY_BACKOFF_MS = Option(
    "retryBackoffMs", "milliseconds, an integer >= 1",
    "The wait before the first retry; each retry after it waits twice the one before, up "
    "to retryMaxBackoffMs, plus up to half again as jitter.",
    default=round(_DEFAULT_POLICY.initial_backoff * 1000),
)
RETRY_MAX_BACKOFF_MS = Option(
    "retryMaxBackoffMs", "milliseconds, an integer >= retryBackoffMs",
    "The longest wait between two retries (before jitter).",
    default=round(_DEFAULT_POLICY.max_backoff * 1000),
)
SSL_CA_FILE = Option(
    "sslCaFile", "a path", "A PEM bundle of CA certificates to trust (a private CA); "
    "readable on every node.")
SSL_CERT_FILE = Option(
    "sslCertFile", "a path", "A PEM client certificate, where the service requires one "
    "(with its key in it or in sslKeyFile); readable on every node.")
SSL_KEY_FILE = Option("sslKeyFile", "a path", "The client certificate's PEM private key.")
SSL_KEY_PASSWORD = Option(
    "sslKeyPassword", "a password", "The private key's password (Spark redacts it).")
NETWORK_OPTIONS = (RETRY_TIMEOUT_MS, RETRY_BACKOFF_MS, RETRY_MAX_BACKOFF_MS, SSL_CA_FILE,
                   SSL_CERT_FILE, SSL_KEY_FILE, SSL_KEY_PASSWORD)

_FILES = ((SSL_CA_FILE, "ca_file"), (SSL_CERT_FILE, "cert_file"), (SSL_KEY_FILE, "key_file"))


@dataclass(frozen=True, slots=True)
class NetworkSettings:
    """Retry budget (seconds without progress), backoff and TLS settings; the key
    password is never shown."""

    retry_timeout: float = DEFAULT_RETRY_TIMEOUT
    tls: TlsConfig | None = None
    retry_backoff: float = _DEFAULT_POLICY.initial_backoff
    retry_max_backoff: float = _DEFAULT_POLICY.max_backoff

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(timeout=self.retry_timeout, initial_backoff=self.retry_backoff,
                           max_backoff=self.retry_max_backoff)


_WHAT = {
    RETRY_TIMEOUT_MS: "how long a failing request is retried without progress; 0 turns "
                      "retries off",
    RETRY_BACKOFF_MS: "the wait before the first retry",
    RETRY_MAX_BACKOFF_MS: "the longest wait between two retries",
}


def _seconds(option: Option, options: Mapping[str, str], least: int) -> float:
    """A whole number of milliseconds >= `least`, in seconds; the default when unset."""
    raw = option.raw(options)
    if raw is None:
        return int(str(option.default)) / 1000.0
    value = raw.strip()
    if not value.isdigit() or int(value) < least:
        raise OptionError(
            f"option {option.name}={raw!r} is not accepted: use {option.takes} "
            f"({_WHAT[option]}; default {option.default})"
        )
    return int(value) / 1000.0


def _backoffs(options: Mapping[str, str]) -> tuple[float, float]:
    """The first and the longest wait; unset, the longest is at least the first."""
    first = _seconds(RETRY_BACKOFF_MS, options, 1)
    longest = _seconds(RETRY_MAX_BACKOFF_MS, options, 1)
    if RETRY_MAX_BACKOFF_MS.raw(options) is None:
        longest = max(longest, first)
    elif longest < first:
        raise OptionError(
            f"option retryMaxBackoffMs={longest * 1000:.0f} is below retryBackoffMs="
            f"{first * 1000:.0f}: the longest wait between retries must be at least the "
            "first")
    return first, longest


def _tls(options: Mapping[str, str]) -> TlsConfig | None:
    files: dict[str, str] = {}
    for option, field_name in _FILES:
        raw = option.raw(options)
        if raw is not None:
            if not raw.strip():
                raise OptionError(f"option {option.name} is empty: use the path of a PEM file")
            files[field_name] = raw.strip()
    password = SSL_KEY_PASSWORD.raw(options)
    if not files and password is None:
        return None
    if "cert_file" not in files and ("key_file" in files or password is not None):
        raise OptionError(
            "options sslKeyFile and sslKeyPassword belong to a client certificate: set "
            "option sslCertFile too"
        )
    # Load the files here, on the driver, so a wrong path fails before any task runs.
    try:
        TlsConfig(ca_file=files.get("ca_file")).ssl_context()
    except ValueError as exc:
        raise OptionError(f"option sslCaFile: {exc}") from None
    tls = TlsConfig(key_password=password or None, **files)
    try:
        tls.ssl_context()
    except ValueError as exc:
        raise OptionError(f"options sslCertFile / sslKeyFile / sslKeyPassword: {exc}") from None
    return tls


def parse_network_options(options: Mapping[str, str]) -> NetworkSettings:
    """The `retry*` and `ssl*` options, checked (TLS files are loaded once)."""
    first, longest = _backoffs(options)
    return NetworkSettings(retry_timeout=_seconds(RETRY_TIMEOUT_MS, options, 0),
                           tls=_tls(options), retry_backoff=first, retry_max_backoff=longest)
