"""The `s2` format's connection and stream-selection options (no pyspark).

Which basin, where it is served, how to authenticate, the key of its encrypted streams and
what the network needs (retry budget, TLS, compression); which streams to read. Shared by
the reader and the writer. The token falls back to S2_ACCESS_TOKEN, the key to
encryptionKeyFile or S2_ENCRYPTION_KEY, here, on the driver, so executors never depend on
their environment or files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from s2_spark._encryption_key import check_encryption_key
from s2_spark._options import Option
from s2_spark.backends.network_options import (
    NETWORK_OPTIONS,
    NetworkSettings,
    parse_network_options,
)
from s2_spark.backends.selection import StreamSelection
from s2_spark.errors import OptionError

__all__ = ["S2_CONNECTION_OPTIONS", "S2_SELECTION_OPTIONS", "S2Settings", "parse_s2_connection",
           "parse_s2_selection", "seq_num_position"]

if TYPE_CHECKING:
    from s2_spark.s2 import S2Config

Compression = Literal["auto", "none", "zstd", "gzip"]
#: The values of option compression, as `S2Config.compression` takes them.
COMPRESSIONS: tuple[Compression, ...] = ("auto", "none", "zstd", "gzip")


@dataclass(frozen=True, slots=True)
class S2Settings:
    """Where the basin lives. The token and the encryption key are resolved once (on the
    driver) and never shown."""

    basin: str
    access_token: str | None = field(default=None, repr=False)
    endpoint: str | None = None
    account_endpoint: str | None = None
    basin_endpoint: str | None = None
    network: NetworkSettings = field(default_factory=NetworkSettings)
    encryption_key: str | None = field(default=None, repr=False)
    compression: Compression = "auto"

    def __repr__(self) -> str:
        token = "None" if self.access_token is None else "'***'"
        key = "None" if self.encryption_key is None else "'***'"
        return (
            f"S2Settings(basin={self.basin!r}, access_token={token}, "
            f"endpoint={self.endpoint!r}, account_endpoint={self.account_endpoint!r}, "
            f"basin_endpoint={self.basin_endpoint!r}, network={self.network!r}, "
            f"encryption_key={key}, compression={self.compression!r})"
        )

    def config(self) -> S2Config:
        from s2_spark.s2 import S2Config

        return S2Config.from_env(
            access_token=self.access_token,
            endpoint=self.endpoint,
            account_endpoint=self.account_endpoint,
            basin_endpoint=self.basin_endpoint,
            retry=self.network.retry_policy(),
            tls=self.network.tls,
            encryption_key=self.encryption_key,
            compression=self.compression,
        )


BASIN = Option("basin", "a basin name", "Required: the basin to read from or write to.")
ENDPOINT = Option(
    "endpoint", "an http:// or https:// URL",
    "One URL for account and basin operations (s2-lite, the local server); default: "
    "S2 cloud, or the S2_ENDPOINT environment variable of the driver.")
ACCOUNT_ENDPOINT = Option(
    "accountEndpoint", "an http:// or https:// URL",
    "S2 cloud's account endpoint (default https://a.s2.dev); not with endpoint.")
BASIN_ENDPOINT = Option(
    "basinEndpoint", "an http:// or https:// URL",
    "S2 cloud's basin endpoint (default https://{basin}.b.s2.dev); not with endpoint.")
ACCESS_TOKEN = Option(
    "accessToken", "a token",
    "The S2 access token; default: the S2_ACCESS_TOKEN environment variable of the "
    "driver. Spark redacts it in plans; it never appears in offsets, logs or errors.")
ENCRYPTION_KEY = Option(
    "encryptionKey", "base64 of 32 bytes",
    "The key of the basin's encrypted streams (those created while its stream_cipher was "
    "set), sent with every append and read; streams without a cipher ignore it. It never "
    "appears in offsets, logs, errors or classic Spark's plans and UI, but Spark Connect "
    "records option values in its event log and UI: there, and whenever the query's code "
    "is shared, use encryptionKeyFile or S2_ENCRYPTION_KEY. Unset: the key in "
    "encryptionKeyFile, else the S2_ENCRYPTION_KEY environment variable of the driver.")
ENCRYPTION_KEY_FILE = Option(
    "encryptionKeyFile", "a path on the driver",
    "A file holding the key (base64 of 32 bytes; surrounding whitespace ignored), read on "
    "the driver when the query starts: the way to keep the key out of the query's code "
    "and out of Spark Connect's event log; not with encryptionKey.")
COMPRESSION = Option(
    "compression", ", ".join(COMPRESSIONS),
    "What answers, S2S frames and request bodies of 1 KiB or more are compressed with "
    "(the Accept-Encoding of every request; zstd falls back to gzip where a server has no "
    "zstd). auto: none for a loopback endpoint (localhost, 127.x, ::1), where it only "
    "costs CPU, zstd otherwise, where it saves bandwidth.",
    default="auto")
S2_CONNECTION_OPTIONS = (BASIN, ENDPOINT, ACCOUNT_ENDPOINT, BASIN_ENDPOINT, ACCESS_TOKEN,
                         ENCRYPTION_KEY, ENCRYPTION_KEY_FILE, *NETWORK_OPTIONS, COMPRESSION)

STREAM = Option("stream", "a stream name", "The one stream to read.", roles=("read",))
STREAMS = Option("streams", "comma-separated stream names", "The streams to read.",
                 roles=("read",))
STREAM_PREFIX = Option(
    "streamPrefix", "a prefix (may be empty)",
    "Every stream whose name starts with it, streams created while the query runs "
    "included (found by the next listing, read from their beginning).", roles=("read",))
#: Exactly one of these selects the streams a read reads.
S2_SELECTION_OPTIONS = (STREAM, STREAMS, STREAM_PREFIX)


def parse_s2_connection(options: Mapping[str, str], *, purpose: str) -> S2Settings:
    """Check the options saying where the basin is and how to authenticate.

    `purpose` ("read from", "write to") makes the message for a missing basin say what the
    basin is for.
    """
    basin = (BASIN.raw(options) or "").strip()
    if not basin:
        raise OptionError(f"option basin is required: the name of the S2 basin to {purpose}")
    token = ACCESS_TOKEN.raw(options)
    if token is not None and (not token.strip() or any(c in token for c in "\r\n")):
        raise OptionError(
            "option accessToken is not accepted: use a non-empty token without line breaks"
        )
    if token is None:
        token = os.environ.get("S2_ACCESS_TOKEN") or None
    endpoint = ENDPOINT.url(options)
    account_endpoint = ACCOUNT_ENDPOINT.url(options)
    basin_endpoint = BASIN_ENDPOINT.url(options)
    if endpoint and (account_endpoint or basin_endpoint):
        raise OptionError(
            "set either option endpoint (one URL for everything, e.g. s2-lite) or "
            "accountEndpoint/basinEndpoint (S2 cloud), not both"
        )
    return S2Settings(
        basin=basin,
        access_token=token,
        endpoint=endpoint,
        account_endpoint=account_endpoint,
        basin_endpoint=basin_endpoint,
        network=parse_network_options(options),
        encryption_key=_encryption_key(options),
        compression=_compression(options),
    )


def _encryption_key(options: Mapping[str, str]) -> str | None:
    """The key from encryptionKey, encryptionKeyFile or S2_ENCRYPTION_KEY, in that order
    (the first two exclusive), checked; errors name where it came from, never the key."""
    given = ENCRYPTION_KEY.raw(options)
    path = ENCRYPTION_KEY_FILE.raw(options)
    if given is not None and path is not None:
        raise OptionError("set option encryptionKey or encryptionKeyFile, not both")
    where = "option encryptionKey"
    if path is not None:
        where = f"the key in encryptionKeyFile {path!r}"
        try:
            given = Path(path.strip()).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise OptionError(
                f"option encryptionKeyFile={path!r}: cannot read the key file on the "
                f"driver ({reason})"
            ) from None
    elif given is None:
        given = os.environ.get("S2_ENCRYPTION_KEY") or None
        where = "the environment variable S2_ENCRYPTION_KEY"
    if given is None:
        return None
    try:
        return check_encryption_key(given, where)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def _compression(options: Mapping[str, str]) -> Compression:
    raw = COMPRESSION.raw(options)
    value = "auto" if raw is None else raw.strip().lower()
    for accepted in COMPRESSIONS:
        if value == accepted:
            return accepted
    raise OptionError(
        f"option compression={raw!r} is not accepted: use {', '.join(COMPRESSIONS)} (auto: "
        "none on loopback, zstd otherwise)")


def parse_s2_selection(options: Mapping[str, str]) -> StreamSelection:
    """Exactly one of stream, streams (comma-separated) or streamPrefix."""
    given = [o for o in S2_SELECTION_OPTIONS if o.raw(options) is not None]
    if len(given) != 1:
        which = f"got {', '.join(o.name for o in given)}" if given else "got none"
        raise OptionError(
            "set exactly one of the options stream (one stream name), streams "
            f"(comma-separated names) or streamPrefix (every stream with that prefix); {which}"
        )
    option = given[0]
    raw = option.raw(options) or ""
    if option is STREAM_PREFIX:
        return StreamSelection(prefix=raw)
    if option is STREAM:
        if not raw.strip():
            raise OptionError(f"option stream={raw!r} is not accepted: use a stream name")
        return StreamSelection(streams=(raw.strip(),))
    return StreamSelection(streams=option.streams(options) or ())


def seq_num_position(value: object) -> int:
    """A position a user wrote: a seq_num."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ValueError(f"a seq_num must be an integer >= 0 (got {json.dumps(value)})")
    return value
