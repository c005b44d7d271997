"""The `s2` format's connection and stream-selection options (no pyspark).

Which basin, where it is served, how to authenticate and what the network needs (retry
budget, TLS); which streams to read. Shared by
the reader and the writer. The token falls back to S2_ACCESS_TOKEN here, on the driver,
so executors never depend on their environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from s2_spark._option_values import get, get_url, split_streams
from s2_spark.backends.network_options import parse_network_options
from s2_spark.backends.s2 import S2Settings
from s2_spark.backends.selection import StreamSelection
from s2_spark.errors import OptionError

__all__ = ["parse_s2_connection", "parse_s2_selection"]

_STREAM_KEYS = ("stream", "streams", "streamPrefix")


def parse_s2_connection(options: Mapping[str, str], *, purpose: str) -> S2Settings:
    """Check the options saying where the basin is and how to authenticate.

    `purpose` ("read from", "write to") makes the message for a missing basin say what the
    basin is for.
    """
    basin = (get(options, "basin") or "").strip()
    if not basin:
        raise OptionError(f"option basin is required: the name of the S2 basin to {purpose}")
    token = get(options, "accessToken")
    if token is not None and (not token.strip() or any(c in token for c in "\r\n")):
        raise OptionError(
            "option accessToken is not accepted: use a non-empty token without line breaks"
        )
    if token is None:
        token = os.environ.get("S2_ACCESS_TOKEN") or None
    endpoint = get_url(options, "endpoint")
    account_endpoint = get_url(options, "accountEndpoint")
    basin_endpoint = get_url(options, "basinEndpoint")
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
    )


def parse_s2_selection(options: Mapping[str, str]) -> StreamSelection:
    """Exactly one of stream, streams (comma-separated) or streamPrefix."""
    given = [key for key in _STREAM_KEYS if get(options, key) is not None]
    if len(given) != 1:
        which = f"got {', '.join(given)}" if given else "got none"
        raise OptionError(
            "set exactly one of the options stream (one stream name), streams "
            f"(comma-separated names) or streamPrefix (every stream with that prefix); {which}"
        )
    key = given[0]
    raw = get(options, key) or ""
    if key == "streamPrefix":
        return StreamSelection(prefix=raw)
    if key == "stream":
        if not raw.strip():
            raise OptionError(f"option stream={raw!r} is not accepted: use a stream name")
        return StreamSelection(streams=(raw.strip(),))
    return StreamSelection(streams=split_streams(raw, key))
