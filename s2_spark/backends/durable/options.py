"""The `durable-streams` format's connection and stream-selection options (no pyspark).

Streams are named by URL: `url` (one), `urls` (comma-separated), or `baseUrl` with
`stream` / `streams` (paths under it). The protocol has no way to list streams, so a read
names its streams. Credentials are request headers, taken from options whose names Spark
redacts in plans and the UI (`bearerToken`, `secretHeaders`); they are kept out of every
repr, offset and error message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from s2_spark._options import Option, split_streams
from s2_spark.backends.network_options import (
    NETWORK_OPTIONS,
    NetworkSettings,
    parse_network_options,
)
from s2_spark.backends.selection import StreamSelection
from s2_spark.errors import OptionError

if TYPE_CHECKING:
    from s2_spark.durable import DurableConfig

__all__ = [
    "DURABLE_CONNECTION_OPTIONS",
    "DURABLE_SELECTION_OPTIONS",
    "DurableSettings",
    "StreamKind",
    "check_offset_position",
    "parse_durable_connection",
    "parse_durable_selection",
]

#: JSON streams count messages, other content types count bytes.
StreamKind = Literal["json", "bytes"]

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)

BASE_URL = Option("baseUrl", "an http:// or https:// URL",
                  "The server's URL, for streams named by path.")
BEARER_TOKEN = Option(
    "bearerToken", "a token",
    "Sent as Authorization: Bearer ...; Spark redacts it; it never appears in offsets, "
    "logs or errors.")
SECRET_HEADERS = Option(
    "secretHeaders", 'a JSON object, e.g. {"x-api-key": "..."}',
    "Extra request headers (credentials); Spark redacts it; values never appear in "
    "offsets, logs or errors.")
DURABLE_CONNECTION_OPTIONS = (BASE_URL, BEARER_TOKEN, SECRET_HEADERS, *NETWORK_OPTIONS)

URL = Option("url", "an http:// or https:// stream URL", "The one stream to read.",
             roles=("read",))
URLS = Option("urls", "comma-separated stream URLs", "The streams to read.", roles=("read",))
PATH = Option("stream", "a path under baseUrl", "The one stream to read.", roles=("read",))
PATHS = Option("streams", "comma-separated paths under baseUrl", "The streams to read.",
               roles=("read",))
#: Exactly one of these names the streams a read reads (the protocol cannot list them).
DURABLE_SELECTION_OPTIONS = (URL, URLS, PATH, PATHS)


@dataclass(frozen=True, slots=True)
class DurableSettings:
    """Where the streams are and which headers authenticate; header values never shown."""

    base_url: str | None = None
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    network: NetworkSettings = field(default_factory=NetworkSettings)

    def __repr__(self) -> str:
        names = [name for name, _ in self.headers]
        return (f"DurableSettings(base_url={self.base_url!r}, headers={names} (values "
                f"hidden), network={self.network!r})")

    def config(self) -> DurableConfig:
        from s2_spark.durable import DurableConfig

        return DurableConfig(base_url=self.base_url, headers=dict(self.headers),
                             retry=self.network.retry_policy(), tls=self.network.tls)


def _secret_headers(raw: str) -> list[tuple[str, str]]:
    accepted = 'use a JSON object of header name to string value, e.g. {"x-api-key": "..."}'
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        # The value may be a secret: never quote it.
        raise OptionError(f"option secretHeaders is not valid JSON; {accepted}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option secretHeaders is not a JSON object; {accepted}")
    out = []
    for name, value in parsed.items():
        if not _TOKEN.match(name):
            raise OptionError(
                f"option secretHeaders: {name!r} is not a valid HTTP header name; {accepted}"
            )
        if not isinstance(value, str) or any(c in value for c in "\r\n"):
            raise OptionError(
                f"option secretHeaders: the value of header {name!r} must be a string without "
                f"line breaks; {accepted}"
            )
        out.append((name.lower(), value))
    return out


def parse_durable_connection(options: Mapping[str, str]) -> DurableSettings:
    """`baseUrl`, the credential and the network options, checked."""
    headers = dict(_secret_headers(SECRET_HEADERS.raw(options) or "{}"))
    token = BEARER_TOKEN.raw(options)
    if token is not None:
        if not token.strip() or any(c in token for c in "\r\n"):
            raise OptionError(
                "option bearerToken is not accepted: use a non-empty token without line breaks"
            )
        if "authorization" in headers:
            raise OptionError(
                "set the authorization header either with option bearerToken or in option "
                "secretHeaders, not both"
            )
        headers["authorization"] = f"Bearer {token.strip()}"
    return DurableSettings(
        base_url=BASE_URL.url(options),
        headers=tuple(sorted(headers.items())),
        network=parse_network_options(options),
    )


def check_stream_urls(names: tuple[str, ...], key: str) -> None:
    for name in names:
        if not name.startswith(("http://", "https://")) or len(name) <= len("https://"):
            raise OptionError(
                f"option {key}: {name!r} is not accepted: use absolute http:// or https:// "
                "stream URLs (or option baseUrl with stream/streams paths)"
            )


def parse_durable_selection(
    options: Mapping[str, str], settings: DurableSettings
) -> StreamSelection:
    """Exactly one of url, urls, or (with baseUrl) stream / streams."""
    given = [o for o in DURABLE_SELECTION_OPTIONS if o.raw(options) is not None]
    if len(given) != 1:
        which = f"got {', '.join(o.name for o in given)}" if given else "got none"
        raise OptionError(
            "set exactly one of the options url (one stream URL), urls (comma-separated "
            "stream URLs), or stream / streams (paths under option baseUrl); " + which
        )
    option = given[0]
    key = option.name
    raw = option.raw(options) or ""
    names = split_streams(raw, key) if option in (URLS, PATHS) else (raw.strip(),)
    if not names[0]:
        raise OptionError(f"option {key}={raw!r} is not accepted: it must not be empty")
    if option in (URL, URLS):
        check_stream_urls(names, key)
    elif settings.base_url is None:
        raise OptionError(
            f"option {key} names stream paths, which need option baseUrl (the server's URL); "
            "or name streams by URL with option url / urls"
        )
    return StreamSelection(streams=names)


def check_offset_position(value: object) -> str:
    """A position a user wrote: an offset string the server gave, or "-1" (the start)."""
    if not isinstance(value, str) or not value or any(ord(c) < 0x21 for c in value):
        raise ValueError(
            "a Durable Streams position is an offset string from Stream-Next-Offset, or '-1' "
            f"for the start (got {value!r})"
        )
    if value == "now":
        raise ValueError("'now' is not a fixed position: use 'latest' instead of a JSON object")
    return value
