"""Reading checked values out of Spark's option map (no pyspark, no protocol).

Spark hands a data source its options as a case-insensitive map of strings; these helpers
read one option each and raise `OptionError` naming the option and what it accepts. They
are shared by every format's option parsing, in the Spark layer and in the backends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from s2_spark.errors import OptionError

__all__ = [
    "get",
    "get_bool",
    "get_duration_ms",
    "get_positive_int",
    "get_url",
    "split_streams",
]

#: Milliseconds per unit of a duration option (Spark's time strings, as Kafka's
#: maxTriggerDelay takes them); a number without a unit is milliseconds.
_DURATION_UNITS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                   "d": 86_400_000}
_DURATION = re.compile(r"(\d+)\s*([a-z]*)")


def get(options: Mapping[str, str], name: str) -> str | None:
    """Look an option up case-insensitively (Spark's map already is; plain dicts too)."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


def get_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = get(options, name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    raise OptionError(f"option {name}={raw!r} is not accepted: use 'true' or 'false'")


def get_positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = get(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(f"option {name}={raw!r} is not accepted: use a positive integer")
    return value


def get_duration_ms(options: Mapping[str, str], name: str) -> int | None:
    """A positive duration such as `15m`, `30s`, `500ms` or `60000` (milliseconds), in
    milliseconds."""
    raw = get(options, name)
    if raw is None:
        return None
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None or match.group(2) not in _DURATION_UNITS or int(match.group(1)) == 0:
        raise OptionError(
            f"option {name}={raw!r} is not accepted: use a positive duration such as '15m', "
            "'30s' or '500ms' (units ms, s, m or min, h, d; a number alone is milliseconds)"
        )
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


def get_url(options: Mapping[str, str], name: str) -> str | None:
    raw = get(options, name)
    if raw is None:
        return None
    value = raw.strip()
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise OptionError(
            f"option {name}={raw!r} is not accepted: use an http:// or https:// URL"
        )
    return value


def split_streams(raw: str, name: str) -> tuple[str, ...]:
    """A comma-separated list of distinct, non-empty stream names (or URLs, or paths)."""
    names = [s.strip() for s in raw.split(",")]
    if any(not n for n in names):
        raise OptionError(
            f"option {name}={raw!r} is not accepted: use comma-separated stream names "
            "(names must not be empty)"
        )
    if len(set(names)) != len(names):
        raise OptionError(f"option {name}={raw!r} names a stream more than once")
    return tuple(names)
