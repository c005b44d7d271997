"""Filter pushdown for batch reads (PySpark 4.1+): predicates that narrow planned ranges.

Spark hands `DataSourceReader.pushFilters` the conjuncts of a query's WHERE clause that it
can express as `pyspark.sql.datasource.Filter`s. The ones on the rows' `stream`, `seq_num`
and `timestamp` columns become a `Narrowing`: a set of streams, a seq_num range and a
timestamp range (epoch milliseconds), which the batch reader intersects with the ranges it
plans from startingPosition/endingPosition. Positions come from the backend (`seq_num` as
`parse_position`, timestamps through `at_timestamp`), so this module knows no protocol.

A filter is reported as handled (not returned to Spark) only when the narrowed ranges hold
exactly the rows it keeps: comparisons and equality on `seq_num` and `timestamp`, and
equality or IN on `stream`. That relies on record timestamps never decreasing along a
stream, which the backend promises (`StreamBackend.supports_filter_pushdown`). An IN list
on `seq_num` or `timestamp` only bounds the range by its smallest and largest values, so it
is returned for Spark to check. Everything else (NOT, IS NULL, string matches, ...) is
returned untouched; an OR never reaches here (Spark pushes only top-level conjuncts).

Imported only where `pushFilters` exists (PySpark 4.1+): the filter classes are new there.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

__all__ = ["Narrowing", "translate"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICRO = dt.timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Narrowing:
    """What pushed filters allow: lower bounds inclusive, upper bounds exclusive; None is
    no bound. Picklable: it travels with the reader."""

    streams: frozenset[str] | None = None
    seq_lo: int | None = None
    seq_hi: int | None = None
    ts_lo_ms: int | None = None
    ts_hi_ms: int | None = None
    #: The pushed filters, as Spark shows predicates, for the reader's repr and logs.
    pushed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pushed)

    def describe(self) -> str:
        return " AND ".join(self.pushed)


def _max(a: int | None, b: int) -> int:
    return b if a is None else max(a, b)


def _min(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def _micros(value: object) -> int | None:
    """A Spark timestamp filter value (an aware datetime) as epoch microseconds."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // _MICRO


def _seq_num(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# A record's Spark timestamp is r * 1000 microseconds for its S2 timestamp r (millis), so
# for a bound of t microseconds:
#   r*1000 >  t  <=>  r >= t // 1000 + 1        r*1000 >= t  <=>  r >= ceil(t / 1000)
#   r*1000 <  t  <=>  r <  ceil(t / 1000)       r*1000 <= t  <=>  r <  t // 1000 + 1
# and the same with 1 in place of 1000 for seq_nums.


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _bounds(f: Filter, scale: int, value: int) -> tuple[int | None, int | None] | None:
    """(inclusive lower, exclusive upper) bound for `column <op> value`, in units of
    `scale` (1 for seq_nums, 1000 for timestamps in ms from microseconds)."""
    if isinstance(f, (EqualTo, EqualNullSafe)):
        return _ceil_div(value, scale), value // scale + 1
    if isinstance(f, GreaterThan):
        return value // scale + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return _ceil_div(value, scale), None
    if isinstance(f, LessThan):
        return None, _ceil_div(value, scale)
    if isinstance(f, LessThanOrEqual):
        return None, value // scale + 1
    return None


_OPS = {
    EqualTo: "=",
    EqualNullSafe: "<=>",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
    In: "IN",
}


def _show(f: Filter) -> str:
    name = ".".join(getattr(f, "attribute", ()))
    value = getattr(f, "value", None)
    values = value if isinstance(value, tuple) else (value,)
    shown = ", ".join(v.isoformat() if isinstance(v, dt.datetime) else repr(v) for v in values)
    return f"{name} {_OPS[type(f)]} " + (f"({shown})" if isinstance(f, In) else shown)


def translate(filters: Sequence[Filter]) -> tuple[Narrowing, list[Filter]]:
    """The narrowing `filters` (ANDed) allow, and the filters Spark must still evaluate
    (each one of `filters`, by identity, as Spark requires)."""
    n = Narrowing()
    keep: list[Filter] = []
    for f in filters:
        narrowed, exact = _one(n, f)
        if narrowed is None:
            keep.append(f)
            continue
        n = replace(narrowed, pushed=(*n.pushed, _show(f)))
        if not exact:
            keep.append(f)
    return n, keep


def _one(n: Narrowing, f: Filter) -> tuple[Narrowing | None, bool]:
    """`n` narrowed by `f` and whether that is exact, or (None, False) if `f` is not used."""
    if type(f) not in _OPS:  # Not, IsNull, IsNotNull, string matches: not pushed
        return None, False
    attribute: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    column = attribute[0].lower() if len(attribute) == 1 else None
    value: object = getattr(f, "value", None)
    if column == "stream":
        narrowed = _streams(n, f, value)
        return narrowed, narrowed is not None
    if column not in ("seq_num", "timestamp"):
        return None, False
    convert = _seq_num if column == "seq_num" else _micros
    scale = 1 if column == "seq_num" else 1000
    lo: int | None
    hi: int | None
    if isinstance(f, In):
        # Only the smallest and largest values bound the range: Spark checks the rest.
        converted = [convert(v) for v in value] if isinstance(value, tuple | list) else []
        values = [v for v in converted if v is not None]
        if not values or len(values) != len(converted):
            return None, False
        lo, hi = _ceil_div(min(values), scale), max(values) // scale + 1
        exact = False
    else:
        v = convert(value)
        bounds = None if v is None else _bounds(f, scale, v)
        if bounds is None:
            return None, False
        (lo, hi), exact = bounds, True
    if column == "seq_num":
        if lo is not None:
            n = replace(n, seq_lo=_max(n.seq_lo, max(lo, 0)))
        if hi is not None:
            n = replace(n, seq_hi=_min(n.seq_hi, max(hi, 0)))
    else:
        if lo is not None:
            n = replace(n, ts_lo_ms=_max(n.ts_lo_ms, max(lo, 0)))
        if hi is not None:
            n = replace(n, ts_hi_ms=_min(n.ts_hi_ms, max(hi, 0)))
    return n, exact


def _streams(n: Narrowing, f: Filter, value: object) -> Narrowing | None:
    """`n` limited to the streams `stream = value` or `stream IN value` allows."""
    names = value if isinstance(f, In) and isinstance(value, tuple | list) else (value,)
    if isinstance(f, GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual) or not all(
        isinstance(name, str) for name in names
    ):
        return None
    allowed = frozenset(str(name) for name in names)
    return replace(n, streams=allowed if n.streams is None else n.streams & allowed)
