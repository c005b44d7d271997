"""The network options every format shares (no pyspark): how long to retry, and TLS.

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
SSL_CA_FILE = Option(
    "sslCaFile", "a path", "A PEM bundle of CA certificates to trust (a private CA); "
    "readable on every node.")
SSL_CERT_FILE = Option(
    "sslCertFile", "a path", "A PEM client certificate, where the service requires one "
    "(with its key in it or in sslKeyFile); readable on every node.")
SSL_KEY_FILE = Option("sslKeyFile", "a path", "The client certificate's PEM private key.")
SSL_KEY_PASSWORD = Option(
    "sslKeyPassword", "a password", "The private key's password (Spark redacts it).")
NETWORK_OPTIONS = (RETRY_TIMEOUT_MS, SSL_CA_FILE, SSL_CERT_FILE, SSL_KEY_FILE, SSL_KEY_PASSWORD)

_FILES = ((SSL_CA_FILE, "ca_file"), (SSL_CERT_FILE, "cert_file"), (SSL_KEY_FILE, "key_file"))


@dataclass(frozen=True, slots=True)
class NetworkSettings:
    """Retry budget (seconds without progress) and TLS settings; the key password is
    never shown."""

    retry_timeout: float = DEFAULT_RETRY_TIMEOUT
    tls: TlsConfig | None = None

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(timeout=self.retry_timeout)


def _retry_timeout(options: Mapping[str, str]) -> float:
    raw = RETRY_TIMEOUT_MS.raw(options)
    if raw is None:
        return DEFAULT_RETRY_TIMEOUT
    value = raw.strip()
    if not value.isdigit():
        raise OptionError(
            f"option retryTimeoutMs={raw!r} is not accepted: use milliseconds, an integer >= 0 "
            f"(how long a failing request is retried without progress; default "
            f"{DEFAULT_RETRY_TIMEOUT * 1000:.0f}, 0 turns retries off)"
        )
    return int(value) / 1000.0


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
    """`retryTimeoutMs` and the `ssl*` options, checked (TLS files are loaded once)."""
    return NetworkSettings(retry_timeout=_retry_timeout(options), tls=_tls(options))
