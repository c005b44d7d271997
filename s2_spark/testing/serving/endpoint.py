"""Where the local server listens: its socket, its URL and its TLS settings, whichever
HTTP stack serves it."""

from __future__ import annotations

import socket
from dataclasses import dataclass

__all__ = ["LISTEN_BACKLOG", "ServerTls", "listen", "url"]

#: Connections the server's listen queue holds (a watch connects many streams at once).
LISTEN_BACKLOG = 1024


@dataclass(frozen=True, slots=True)
class ServerTls:
    """Serve HTTPS with `cert_file` (PEM chain) and `key_file`; with `client_ca_file`, also
    require a client certificate signed by one of its CAs (mutual TLS)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    def args(self) -> list[str]:
        """The command-line flags of `python -m s2_spark.testing` that select this."""
        out = ["--tls-cert", self.cert_file, "--tls-key", self.key_file]
        if self.client_ca_file is not None:
            out += ["--tls-client-ca", self.client_ca_file]
        return out


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    return sock


def url(host: str, port: int, tls: ServerTls | None = None) -> str:
    scheme = "https" if tls is not None else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
