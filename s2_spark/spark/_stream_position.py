"""One stream's position in a JSON startingPosition/endingPosition: a format position,
or a time.

`{"orders": 42, "clicks": {"timestamp": 1700000000000}}` starts (or ends) `orders` at
seq_num 42 and `clicks` at its first record at or after that time. The time form is the
same for every format that has record timestamps, so it is checked here, once; the
format's own positions are checked by its `check_position`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["StreamTimestamp", "position_json", "stream_position"]

#: How a per-stream time is written, for messages.
TIMESTAMP_FORM = '{"timestamp": <epoch millis>}'


@dataclass(frozen=True, slots=True)
class StreamTimestamp:
    """A stream's bound given as a time: its first record at or after `ms` (epoch
    milliseconds), or its tail when every record is older."""

    ms: int


def stream_position(
    value: object, check_position: Callable[[object], object], *, timestamps: bool
) -> object:
    """`value` checked: a `StreamTimestamp` for `{"timestamp": ms}`, else the format's
    position as written. ValueError says what was wrong."""
    if not isinstance(value, dict) or not (timestamps or "timestamp" in value):
        check_position(value)
        return value
    if not timestamps:
        raise ValueError(
            f"this format's records carry no timestamps, so a stream cannot start or end at "
            f"a time (got {json.dumps(value)})"
        )
    if "timestamp" not in value:
        raise ValueError(
            f"an object position is a time, written {TIMESTAMP_FORM} (got {json.dumps(value)})"
        )
    if len(value) != 1:
        extra = sorted(k for k in value if k != "timestamp")
        raise ValueError(
            f"a time is written {TIMESTAMP_FORM} with no other key (got {json.dumps(value)}, "
            f"extra key(s) {extra})"
        )
    ms = value["timestamp"]
    if isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms < 2**64:
        raise ValueError(
            f"the timestamp must be epoch milliseconds, an integer >= 0 (got {json.dumps(ms)})"
        )
    return StreamTimestamp(ms)


def position_json(position: object) -> object:
    """A checked position as the user wrote it, for messages."""
    if isinstance(position, StreamTimestamp):
        return {"timestamp": position.ms}
    return position
