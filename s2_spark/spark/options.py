"""Parse and check the reader's Spark options before any task runs.

Spark hands a data source its options as a case-insensitive map of strings. Every value is
checked here, on the driver, and a bad one raises `OptionError` naming the option and what
it accepts. Network checks (does the stream exist?) happen later, when the query plans.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from s2_spark.backends.s2 import S2Settings
from s2_spark.errors import S2SparkError
from s2_spark.spark._compat import HAS_ADMISSION_CONTROL, SPARK_VERSION

__all__ = [
    "BoundSpec",
    "OptionError",
    "ReadOptions",
    "StreamSelection",
    "parse_connection",
    "parse_read_options",
]

BoundKind = Literal["earliest", "latest", "timestamp", "positions"]


class OptionError(S2SparkError, ValueError):
    """A data source option is missing, conflicting or has a value that is not accepted."""


@dataclass(frozen=True, slots=True)
class BoundSpec:
    """A starting or ending position as the user wrote it, per kind."""

    kind: BoundKind
    timestamp_ms: int = 0
    positions: tuple[tuple[str, object], ...] = ()

    def describe(self) -> str:
        if self.kind == "timestamp":
            return f"timestamp:{self.timestamp_ms}"
        if self.kind == "positions":
            return json.dumps(dict(self.positions))
        return self.kind


@dataclass(frozen=True, slots=True)
class StreamSelection:
    """Which streams to read: a fixed list, or every stream with a prefix."""

    streams: tuple[str, ...] = ()
    prefix: str | None = None

    def matches(self, stream: str) -> bool:
        if self.prefix is not None:
            return stream.startswith(self.prefix)
        return stream in self.streams


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The reader's options, checked. The access token never appears in repr."""

    connection: S2Settings
    selection: StreamSelection
    starting: BoundSpec = BoundSpec("earliest")
    ending: BoundSpec | None = None
    max_records_per_trigger: int | None = None
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = True
    include_command_records: bool = False
    fail_on_data_loss: bool = True

_STREAM_KEYS = ("stream", "streams", "streamPrefix")


def _get(options: Mapping[str, str], name: str) -> str | None:
    """Look an option up case-insensitively (Spark's map already is; plain dicts too)."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    raise OptionError(f"option {name}={raw!r} is not accepted: use 'true' or 'false'")


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(f"option {name}={raw!r} is not accepted: use a positive integer")
    return value


def _url(options: Mapping[str, str], name: str) -> str | None:
    raw = _get(options, name)
    if raw is None:
        return None
    value = raw.strip()
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise OptionError(
            f"option {name}={raw!r} is not accepted: use an http:// or https:// URL"
        )
    return value


def _bound(raw: str, name: str, *, allow_earliest: bool) -> BoundSpec:
    kinds = "'earliest', 'latest'" if allow_earliest else "'latest'"
    accepted = (
        f"use {kinds}, 'timestamp:<epoch millis>' or a JSON object of stream name to "
        f"seq_num such as {{\"events\": 42}}"
    )
    value = raw.strip()
    lowered = value.lower()
    if lowered == "latest" or (allow_earliest and lowered == "earliest"):
        return BoundSpec(lowered)  # type: ignore[arg-type]
    if lowered.startswith("timestamp:"):
        digits = value[len("timestamp:"):].strip()
        if digits.isdigit() and int(digits) < 2**64:
            return BoundSpec("timestamp", timestamp_ms=int(digits))
        raise OptionError(f"option {name}={raw!r} is not accepted: the timestamp must be "
                          f"epoch milliseconds (an integer >= 0); {accepted}")
    if value.startswith("{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise OptionError(
                f"option {name} is not valid JSON ({exc.msg} at char {exc.pos}); {accepted}"
            ) from None
        if not isinstance(parsed, dict) or not parsed:
            raise OptionError(f"option {name} must name at least one stream; {accepted}")
        for stream, pos in parsed.items():
            if isinstance(pos, bool) or not isinstance(pos, int) or pos < 0:
                raise OptionError(
                    f"option {name}: the position of stream {stream!r} must be a seq_num "
                    f"(an integer >= 0), got {json.dumps(pos)}; {accepted}"
                )
        return BoundSpec("positions", positions=tuple(sorted(parsed.items())))
    raise OptionError(f"option {name}={raw!r} is not accepted; {accepted}")


def parse_connection(options: Mapping[str, str], *, purpose: str) -> S2Settings:
    """Check the options saying where the basin is and how to authenticate.

    Shared by the reader and the writer; `purpose` ("read from", "write to") makes the
    message for a missing basin say what the basin is for. The token falls back to
    S2_ACCESS_TOKEN here, on the driver, so executors never depend on their environment.
    """
    basin = (_get(options, "basin") or "").strip()
    if not basin:
        raise OptionError(f"option basin is required: the name of the S2 basin to {purpose}")
    token = _get(options, "accessToken")
    if token is not None and (not token.strip() or any(c in token for c in "\r\n")):
        raise OptionError(
            "option accessToken is not accepted: use a non-empty token without line breaks"
        )
    if token is None:
        token = os.environ.get("S2_ACCESS_TOKEN") or None
    endpoint = _url(options, "endpoint")
    account_endpoint = _url(options, "accountEndpoint")
    basin_endpoint = _url(options, "basinEndpoint")
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
    )


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check every reader option; raise `OptionError` for the first bad one."""
    connection = parse_connection(options, purpose="read from")

    given = [key for key in _STREAM_KEYS if _get(options, key) is not None]
    if len(given) != 1:
        which = f"got {', '.join(given)}" if given else "got none"
        raise OptionError(
            "set exactly one of the options stream (one stream name), streams "
            f"(comma-separated names) or streamPrefix (every stream with that prefix); {which}"
        )
    key = given[0]
    raw = _get(options, key) or ""
    if key == "streamPrefix":
        selection = StreamSelection(prefix=raw)
    else:
        names = [raw.strip()] if key == "stream" else [s.strip() for s in raw.split(",")]
        if any(not n for n in names):
            raise OptionError(
                f"option {key}={raw!r} is not accepted: use "
                + ("a stream name" if key == "stream" else "comma-separated stream names")
                + " (names must not be empty)"
            )
        if len(set(names)) != len(names):
            raise OptionError(f"option {key}={raw!r} names a stream more than once")
        selection = StreamSelection(streams=tuple(names))

    starting_raw = _get(options, "startingPosition")
    starting = (
        BoundSpec("earliest")
        if starting_raw is None
        else _bound(starting_raw, "startingPosition", allow_earliest=True)
    )
    ending_raw = _get(options, "endingPosition")
    ending: BoundSpec | None = None
    if ending_raw is not None:
        if streaming:
            raise OptionError(
                "option endingPosition applies to batch reads (spark.read) only; a streaming "
                "query reads on as records arrive: use trigger(availableNow=True) to stop"
            )
        ending = _bound(ending_raw, "endingPosition", allow_earliest=False)
    for spec, name in ((starting, "startingPosition"), (ending, "endingPosition")):
        if spec is not None and spec.kind == "positions":
            foreign = [s for s, _ in spec.positions if not selection.matches(s)]
            if foreign:
                raise OptionError(
                    f"option {name} names stream(s) {foreign} that the stream/streams/"
                    f"streamPrefix option does not select"
                )

    max_records_per_trigger = _positive_int(options, "maxRecordsPerTrigger")
    if max_records_per_trigger is not None and not HAS_ADMISSION_CONTROL:
        raise OptionError(
            f"option maxRecordsPerTrigger needs PySpark 4.2 or newer (admission control for "
            f"Python streaming sources); this is PySpark {SPARK_VERSION}: remove the option "
            "or upgrade Spark"
        )
    return ReadOptions(
        connection=connection,
        selection=selection,
        starting=starting,
        ending=ending,
        max_records_per_trigger=max_records_per_trigger,
        min_partitions=_positive_int(options, "minPartitions"),
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
        include_headers=_bool(options, "includeHeaders", True),
        include_command_records=_bool(options, "includeCommandRecords", False),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
    )
