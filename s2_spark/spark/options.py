"""Parse and check the reader's Spark options before any task runs.

Spark hands a data source its options as a case-insensitive map of strings. Every value is
checked here, on the driver, and a bad one raises `OptionError` naming the option and what
it accepts. The options every format shares (positions, limits, data loss) are parsed here;
what a format adds (where its service is, which streams, what a position looks like) comes
from its `ReadFormat`. Network checks (does the stream exist?) happen later, when the query
plans.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from s2_spark._options import Option, OptionSet
from s2_spark.backends.selection import StreamSelection
from s2_spark.errors import OptionError
from s2_spark.spark._compat import HAS_ADMISSION_CONTROL, SPARK_VERSION
from s2_spark.spark._stream_position import (
    TIMESTAMP_FORM,
    position_json,
    stream_position,
)
from s2_spark.spark.partitions import DEFAULT_MAX_STREAMS_PER_PARTITION

__all__ = [
    "BYTES",
    "BYTE_TRIGGER_OPTIONS",
    "READ_OPTIONS",
    "RECORDS",
    "BoundSpec",
    "OptionError",
    "ReadFormat",
    "ReadOptions",
    "StreamSelection",
    "TriggerUnits",
    "parse_read_options",
    "require_admission_control",
]

#: How often a streaming query lists the streams of its streamPrefix again, by default.
DEFAULT_DISCOVERY_INTERVAL_MS = 1000
#: How long a trigger held by a minimum waits at most, by default (Kafka's 15m).
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

STARTING_POSITION = Option(
    "startingPosition", "earliest, latest, timestamp:<epoch millis>, or JSON",
    "Where a query without a checkpoint starts (a checkpoint always wins). A time starts "
    "at the first record at or after it (at the tail when every record is older); a JSON "
    'object maps streams to positions, e.g. {"orders": 42, "clicks": {"timestamp": '
    '1700000000000}} for format s2; streams left out start at earliest.',
    default="earliest", roles=("read",))
ENDING_POSITION = Option(
    "endingPosition", "latest, timestamp:<epoch millis>, or JSON",
    "Batch reads only: where the read ends, exclusive (like Kafka's endingOffsets); a "
    "time after every record ends at the tail; streams left out of a JSON object end at "
    "latest.", default="latest", roles=("read",))
MAX_RECORDS_PER_TRIGGER = Option(
    "maxRecordsPerTrigger", "a positive integer",
    "At most this many records per micro-batch, shared fairly across streams; also "
    "paces trigger(availableNow=True). PySpark 4.2+.", roles=("read",))
MIN_RECORDS_PER_TRIGGER = Option(
    "minRecordsPerTrigger", "a positive integer",
    "A trigger that finds fewer new records than this, across the streams, waits for more, "
    "but no longer than maxTriggerDelay after the last micro-batch (Kafka's "
    "minOffsetsPerTrigger; not for availableNow). PySpark 4.2+.", roles=("read",))
MAX_TRIGGER_DELAY = Option(
    "maxTriggerDelay", "a duration: 15m, 30s, 500ms, or milliseconds",
    "How long a trigger waits for minRecordsPerTrigger (minBytesPerTrigger) at most, "
    "counted from the last micro-batch; only with a minimum.", default="15m",
    roles=("read",))
MAX_BYTES_PER_TRIGGER = Option(
    "maxBytesPerTrigger", "a positive integer",
    "Durable Streams byte streams: at most this many bytes per micro-batch, shared fairly "
    "across streams (maxRecordsPerTrigger counts the messages of JSON streams). "
    "PySpark 4.2+.", roles=("read",))
MIN_BYTES_PER_TRIGGER = Option(
    "minBytesPerTrigger", "a positive integer",
    "Durable Streams byte streams: minRecordsPerTrigger in bytes. PySpark 4.2+.",
    roles=("read",))
MIN_PARTITIONS = Option(
    "minPartitions", "a positive integer",
    "Split long ranges so that a micro-batch has at least this many tasks.",
    roles=("read",))
MAX_RECORDS_PER_PARTITION = Option(
    "maxRecordsPerPartition", "a positive integer",
    "Split long ranges into tasks of at most this many records.", roles=("read",))
MAX_STREAMS_PER_PARTITION = Option(
    "maxStreamsPerPartition", "a positive integer",
    "Small ranges of many streams share a task, read concurrently inside it: up to this "
    "many streams per task; 1 gives every stream its own task.",
    default=DEFAULT_MAX_STREAMS_PER_PARTITION, roles=("read",))
DISCOVERY_INTERVAL_MS = Option(
    "discoveryIntervalMs", "milliseconds, a positive integer",
    "How often a streaming query whose plans keep finding data lists the streams of "
    "streamPrefix again (a plan that would find nothing new lists them first).",
    default=DEFAULT_DISCOVERY_INTERVAL_MS, roles=("read",))
INCLUDE_HEADERS = Option(
    "includeHeaders", "true, false", "false drops the headers column.", default=True,
    roles=("read",))
INCLUDE_COMMAND_RECORDS = Option(
    "includeCommandRecords", "true, false",
    "Command records (fence, trim) are skipped and offsets move past them; true returns "
    "them as rows.", default=False, roles=("read",))
FAIL_ON_DATA_LOSS = Option(
    "failOnDataLoss", "true, false",
    "Records of a planned range that are gone (trimmed, expired, a stream deleted) fail "
    "the query naming the stream and range; false logs a warning and reads on.",
    default=True, roles=("read",))
#: The reader options every format shares (some refused by a format, with the reason).
READ_OPTIONS = (STARTING_POSITION, ENDING_POSITION, MAX_RECORDS_PER_TRIGGER,
                MIN_RECORDS_PER_TRIGGER, MAX_TRIGGER_DELAY, MIN_PARTITIONS,
                MAX_RECORDS_PER_PARTITION, MAX_STREAMS_PER_PARTITION, DISCOVERY_INTERVAL_MS,
                INCLUDE_HEADERS, INCLUDE_COMMAND_RECORDS, FAIL_ON_DATA_LOSS)
#: Durable Streams byte streams' per-trigger sizes (format s2 refuses them).
BYTE_TRIGGER_OPTIONS = (MAX_BYTES_PER_TRIGGER, MIN_BYTES_PER_TRIGGER)

BoundKind = Literal["earliest", "latest", "timestamp", "positions"]


@dataclass(frozen=True, slots=True)
class BoundSpec:
    """A starting or ending position as the user wrote it, per kind. `positions`: each
    named stream's checked position, the format's as written or a `StreamTimestamp`."""

    kind: BoundKind
    timestamp_ms: int = 0
    positions: tuple[tuple[str, object], ...] = ()

    def describe(self) -> str:
        if self.kind == "timestamp":
            return f"timestamp:{self.timestamp_ms}"
        if self.kind == "positions":
            return json.dumps({s: position_json(p) for s, p in self.positions})
        return self.kind


@dataclass(frozen=True, slots=True)
class TriggerUnits:
    """The options that size a micro-batch in one unit: records (messages) or bytes."""

    minimum: Option
    maximum: Option


RECORDS = TriggerUnits(MIN_RECORDS_PER_TRIGGER, MAX_RECORDS_PER_TRIGGER)
BYTES = TriggerUnits(MIN_BYTES_PER_TRIGGER, MAX_BYTES_PER_TRIGGER)


@dataclass(frozen=True, slots=True)
class ReadFormat:
    """What one format adds to the shared reader options.

    `connection` parses where the service is and how to authenticate; `selection` which
    streams to read (it gets the connection too); `check_position` validates a position
    a user wrote in a JSON bound (ValueError says what is accepted); `position_example`
    shows one in messages. `timestamps`: whether `timestamp:` bounds and per-stream
    `{"timestamp": ms}` positions exist. `options` declares every option of the format
    (reading and writing), checked first.
    """

    name: str
    connection: Callable[[Mapping[str, str]], Any]
    selection: Callable[[Mapping[str, str], Any], StreamSelection]
    check_position: Callable[[object], object]
    position_example: str
    options: OptionSet
    timestamps: bool = True


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """The reader's options, checked. Credentials never appear in repr."""

    connection: Any
    selection: StreamSelection
    starting: BoundSpec = BoundSpec("earliest")
    ending: BoundSpec | None = None
    #: Per-trigger sizes, in the format's unit (see `TriggerUnits`): at most
    #: `max_units_per_trigger`; a trigger with fewer than `min_units_per_trigger` new
    #: waits, until `max_trigger_delay_ms` after the last micro-batch.
    max_units_per_trigger: int | None = None
    min_units_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_streams_per_partition: int = DEFAULT_MAX_STREAMS_PER_PARTITION
    discovery_interval_ms: int = DEFAULT_DISCOVERY_INTERVAL_MS
    include_headers: bool = True
    include_command_records: bool = False
    fail_on_data_loss: bool = True


def _bound(raw: str, name: str, fmt: ReadFormat, *, allow_earliest: bool) -> BoundSpec:
    kinds = "'earliest', 'latest'" if allow_earliest else "'latest'"
    timestamp = ", 'timestamp:<epoch millis>'" if fmt.timestamps else ""
    per_stream_time = f", or to a time {TIMESTAMP_FORM}" if fmt.timestamps else ""
    accepted = (
        f"use {kinds}{timestamp} or a JSON object of stream to position such as "
        f"{fmt.position_example}{per_stream_time}"
    )
    value = raw.strip()
    lowered = value.lower()
    if lowered == "latest" or (allow_earliest and lowered == "earliest"):
        return BoundSpec(lowered)  # type: ignore[arg-type]
    if fmt.timestamps and lowered.startswith("timestamp:"):
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
        checked: dict[str, object] = {}
        for stream, pos in parsed.items():
            try:
                checked[stream] = stream_position(pos, fmt.check_position,
                                                  timestamps=fmt.timestamps)
            except ValueError as exc:
                raise OptionError(
                    f"option {name}: the position of stream {stream!r} is not accepted "
                    f"({exc}); {accepted}"
                ) from None
        return BoundSpec("positions", positions=tuple(sorted(checked.items())))
    raise OptionError(f"option {name}={raw!r} is not accepted; {accepted}")


def _bounds(
    options: Mapping[str, str], fmt: ReadFormat, selection: StreamSelection, streaming: bool
) -> tuple[BoundSpec, BoundSpec | None]:
    starting_raw = STARTING_POSITION.raw(options)
    starting = (
        BoundSpec("earliest")
        if starting_raw is None
        else _bound(starting_raw, "startingPosition", fmt, allow_earliest=True)
    )
    ending_raw = ENDING_POSITION.raw(options)
    ending: BoundSpec | None = None
    if ending_raw is not None:
        if streaming:
            raise OptionError(
                "option endingPosition applies to batch reads (spark.read) only; a streaming "
                "query reads on as records arrive: use trigger(availableNow=True) to stop"
            )
        ending = _bound(ending_raw, "endingPosition", fmt, allow_earliest=False)
    for spec, name in ((starting, "startingPosition"), (ending, "endingPosition")):
        if spec is not None and spec.kind == "positions":
            foreign = [s for s, _ in spec.positions if not selection.matches(s)]
            if foreign:
                raise OptionError(
                    f"option {name} names stream(s) {foreign} that the options selecting "
                    "streams do not select"
                )
    return starting, ending


def require_admission_control(name: str) -> None:
    """Fail option `name`, a per-trigger limit, where Spark cannot honour it."""
    if not HAS_ADMISSION_CONTROL:
        raise OptionError(
            f"option {name} needs PySpark 4.2 or newer (admission control for Python "
            f"streaming sources); this is PySpark {SPARK_VERSION}: remove the option or "
            "upgrade Spark"
        )


def _trigger_sizes(
    options: Mapping[str, str], units: TriggerUnits
) -> tuple[int | None, int | None, int]:
    """(minimum, maximum, delay ms) per trigger, in `units`, checked together."""
    low = units.minimum.count(options)
    high = units.maximum.count(options)
    delay = MAX_TRIGGER_DELAY.duration_ms(options)
    for option, value in ((units.maximum, high), (units.minimum, low)):
        if value is not None:
            require_admission_control(option.name)
    if delay is not None and low is None:
        raise OptionError(
            f"option maxTriggerDelay applies only with option {units.minimum.name}: it "
            "bounds how long a trigger waits for that minimum; set both, or neither"
        )
    if low is not None and high is not None and low > high:
        raise OptionError(
            f"option {units.minimum.name}={low} is more than option "
            f"{units.maximum.name}={high}: the minimum must not exceed the maximum"
        )
    return low, high, DEFAULT_MAX_TRIGGER_DELAY_MS if delay is None else delay


def parse_read_options(
    options: Mapping[str, str],
    *,
    streaming: bool,
    fmt: ReadFormat,
    trigger_units: Callable[[ReadOptions], TriggerUnits] | None = None,
) -> ReadOptions:
    """Check every reader option; raise `OptionError` for the first bad one.

    `trigger_units` says, from the other options, in which unit the per-trigger sizes
    count (default `RECORDS`)."""
    fmt.options.check(options, "read")
    connection = fmt.connection(options)
    selection = fmt.selection(options, connection)
    starting, ending = _bounds(options, fmt, selection, streaming)
    parsed = ReadOptions(
        connection=connection,
        selection=selection,
        starting=starting,
        ending=ending,
        min_partitions=MIN_PARTITIONS.count(options),
        max_records_per_partition=MAX_RECORDS_PER_PARTITION.count(options),
        max_streams_per_partition=MAX_STREAMS_PER_PARTITION.amount(options),
        discovery_interval_ms=DISCOVERY_INTERVAL_MS.amount(options),
        include_headers=INCLUDE_HEADERS.flag(options),
        include_command_records=INCLUDE_COMMAND_RECORDS.flag(options),
        fail_on_data_loss=FAIL_ON_DATA_LOSS.flag(options),
    )
    units = RECORDS if trigger_units is None else trigger_units(parsed)
    low, high, delay = _trigger_sizes(options, units)
    return replace(parsed, min_units_per_trigger=low, max_units_per_trigger=high,
                   max_trigger_delay_ms=delay)
