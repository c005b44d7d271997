"""TLS settings beyond the defaults, and telling TLS misconfiguration from flaky networks.

A certificate that is not trusted, or a handshake the server refuses, fails the same way on
every attempt: it is reported at once (`tls_problem`), not retried like a cut connection.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # ssl is imported where a context is made or a failure read
    import ssl

__all__ = ["TlsConfig", "TlsProblem", "default_ssl_context", "ssl_context_for", "tls_problem"]

# TLS alerts and handshake failures that retrying cannot fix (a configuration problem).
_TLS_CONFIG_REASONS = frozenset({
    "CERTIFICATE_VERIFY_FAILED",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_HANDSHAKE_FAILURE",
    "TLSV1_ALERT_UNKNOWN_CA",
    "TLSV1_ALERT_ACCESS_DENIED",
    "WRONG_VERSION_NUMBER",
})


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS settings beyond the defaults. Paths must be readable wherever the client runs
    (on every Spark node).

    * `ca_file`: a PEM bundle of the CA certificates to trust instead of the default ones
      (certifi's, or `SSL_CERT_FILE` / `SSL_CERT_DIR` when set): for a private CA.
    * `cert_file`, `key_file`: a client certificate (PEM; the key may be inside
      `cert_file`), for services that require one (mutual TLS). `key_password` decrypts
      an encrypted key; it is never shown.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("ca_file", "cert_file", "key_file", "key_password"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"TlsConfig.{name} must be a non-empty string or None")
        if self.cert_file is None and (self.key_file or self.key_password):
            raise ValueError("TlsConfig.key_file and key_password need cert_file")

    def __repr__(self) -> str:
        password = "None" if self.key_password is None else "'***'"
        return (f"TlsConfig(ca_file={self.ca_file!r}, cert_file={self.cert_file!r}, "
                f"key_file={self.key_file!r}, key_password={password})")

    def ssl_context(self) -> ssl.SSLContext:
        """The context to verify servers with; ValueError names the file that failed."""
        import ssl

        if self.ca_file is None:
            ctx = default_ssl_context()
        else:
            try:
                ctx = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"the CA bundle {self.ca_file!r} could not be loaded ({_reason(exc)}); "
                    "it must be a PEM file of CA certificates readable on every node"
                ) from None
        if self.cert_file is not None:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file, self._password)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"the client certificate {self.cert_file!r}"
                    + (f" with key {self.key_file!r}" if self.key_file else "")
                    + f" could not be loaded ({_reason(exc)}); both must be PEM files "
                    "readable on every node, and an encrypted key needs its password"
                ) from None
        return ctx

    def _password(self) -> str:
        # A callable, so an encrypted key without a password fails instead of OpenSSL
        # prompting on a terminal that a Spark executor does not have.
        return self.key_password or ""


def ssl_context_for(tls: TlsConfig | None) -> ssl.SSLContext:
    """The context to verify servers with: `tls`'s, or the default one."""
    return tls.ssl_context() if tls is not None else default_ssl_context()


def default_ssl_context() -> ssl.SSLContext:
    """What httpx trusts by default: `SSL_CERT_FILE` or `SSL_CERT_DIR` when set, else
    certifi's bundle."""
    import ssl

    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _reason(exc: BaseException) -> str:
    import ssl

    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


@dataclass(frozen=True, slots=True)
class TlsProblem:
    """A TLS failure that retrying cannot fix: `verify` (the server's certificate is not
    trusted) or `handshake` (the server refused ours, or spoke no TLS)."""

    kind: str
    reason: str


def tls_problem(exc: BaseException) -> TlsProblem | None:
    """The TLS configuration problem behind a transport failure, if that is what it is."""
    import ssl

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLCertVerificationError):
            return TlsProblem("verify", cur.verify_message or str(cur.reason))
        if isinstance(cur, ssl.SSLError) and str(cur.reason) in _TLS_CONFIG_REASONS:
            return TlsProblem("handshake", str(cur.reason))
        cur = cur.__cause__ or cur.__context__
    return None
