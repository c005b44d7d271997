"""Which way a request to an origin goes: straight there, or through the proxy that the
standard environment names for it, and the httpcore connection pool that takes that way.

Proxies come from `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` (upper or lower
case, read with the standard library's rules) in the environment of each process, as
httpx's `trust_env` reads them: an `https://` origin goes through a CONNECT tunnel, an
`http://` one is forwarded. The choice is made once per origin, not per request.
"""

from __future__ import annotations

import ssl
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import httpcore

__all__ = ["Endpoint", "PoolLimits", "Route", "route_for"]


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """Connections one pool opens at most, and keeps open while idle (for how long)."""

    max_connections: int = 64
    max_keepalive: int = 16
    keepalive_expiry: float = 5.0


@dataclass(frozen=True, slots=True)
class Route:
    """No proxy (`proxy` None), or the proxy's URL and credentials (never shown)."""

    proxy: str | None = None

    def __repr__(self) -> str:
        return "Route(direct)" if self.proxy is None else "Route(proxy)"

    def pool(self, ssl_context: ssl.SSLContext | None, limits: PoolLimits, *,
             backend: Any = None) -> Any:
        """A new httpcore pool taking this route, opening connections through `backend`
        (httpcore's default when None)."""
        common: dict[str, Any] = {
            "ssl_context": ssl_context,
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive,
            "keepalive_expiry": limits.keepalive_expiry,
            "network_backend": backend,
        }
        if self.proxy is None:
            return httpcore.ConnectionPool(**common)
        parts = urlsplit(self.proxy)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"the proxy named by the environment ({parts.scheme}://{parts.hostname}) is "
                "not supported: use an http:// or https:// proxy URL in HTTPS_PROXY / "
                "HTTP_PROXY"
            )
        auth = None
        if parts.username is not None:
            auth = (unquote(parts.username), unquote(parts.password or ""))
        port = parts.port or (443 if parts.scheme == "https" else 80)
        url = httpcore.URL(scheme=parts.scheme.encode(), host=parts.hostname.encode(),
                           port=port, target=b"/")
        return httpcore.HTTPProxy(proxy_url=url, proxy_auth=auth, **common)


def route_for(scheme: str, host: str, port: int) -> Route:
    """The route to `scheme://host:port` that the environment asks for now."""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(scheme) or proxies.get("all")
    if not proxy or _bypassed(host, port, proxies.get("no", "")):
        return Route()
    return Route(proxy if "://" in proxy else f"http://{proxy}")


def _bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether NO_PROXY exempts the host: `*`, the host itself, or a domain it is in
    (`example.com` and `.example.com` both cover `api.example.com`), with `:port` when
    an entry names one."""
    host = host.lower().strip("[]")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (
            entry, "", "")
        name = name.strip("[]").lstrip(".")
        if not name or (entry_port and entry_port != str(port)):
            continue
        if host == name or host.endswith("." + name):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a base URL's requests go, as the asyncio connections need it: TLS or not,
    host and port, `authority` (host:port, for CONNECT and HTTP/2), `host_header` (the
    port left out when it is the scheme's own), the path prefix and the proxy, if any."""

    scheme: str
    tls: bool
    host: str
    port: int
    authority: str
    host_header: str
    prefix: str
    proxy: str | None

    @classmethod
    def of(cls, base_url: str) -> Endpoint:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {base_url!r}")
        tls = parts.scheme == "https"
        host = parts.hostname
        port = parts.port or (443 if tls else 80)
        shown = f"[{host}]" if ":" in host else host
        authority = f"{shown}:{port}"
        default = port == (443 if tls else 80)
        return cls(parts.scheme, tls, host, port, authority, shown if default else authority,
                   parts.path.rstrip("/"), route_for(parts.scheme, host, port).proxy)
