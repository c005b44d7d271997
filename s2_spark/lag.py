"""How far a streaming query's `s2` and `durable-streams` sources are behind, from one
progress report.

Spark gives every Python data source the same description (its class name and a hash:
`...python.PythonMicroBatchStream@1a2b3c`), so a source is taken for ours when that
description names a Python stream and its offsets have our shape: `{stream: next_seq_num}`
for S2, `{stream: {"offset", "skip"[, "closed"]}}` for Durable Streams, either of them in
the compact form of offsets over many streams (`s2_spark._offset_codec`). A progress holds,
per source, the end of the micro-batch it reports (`endOffset`) and, on PySpark 4.2+, the
tails the plan saw (`latestOffset`, the reader's `reportLatestOffset()`); the lag is the
gap between them. Before 4.2 there is no `latestOffset` for Python sources, and the lag is
unknown (None), never 0.

Nothing here imports pyspark: a progress is read as the dict it is (PySpark 4.x's
`StreamingQueryProgress` is a dict), an object with the same attributes, or its JSON.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from s2_spark._offset_codec import decode_offset

__all__ = ["NO_LATEST_OFFSET", "QueryLag", "SourceLag", "StreamLag", "lag_of"]

Format = Literal["s2", "durable-streams"]

#: Why a lag is unknown when the progress has no `latestOffset` for a source.
NO_LATEST_OFFSET = (
    "the progress has no latestOffset for this source (PySpark 4.2+ reports it for "
    "Python data sources)"
)
#: What Spark's description of a Python data source's micro-batch stream contains.
_PYTHON_STREAM = "PythonMicroBatchStream"
#: How many streams a description names, worst first.
WORST = 3
_DURABLE_KEYS = frozenset({"offset", "skip", "closed"})
_DURABLE_ORIGIN: Mapping[str, Any] = {"offset": "-1", "skip": 0}


@dataclass(frozen=True)
class StreamLag:
    """One stream's lag at the end of a micro-batch.

    `records`: how many the stream is behind its latest planned tail: S2 records; for
    Durable Streams, messages of a JSON stream or bytes of another, and only where the
    end and the tail share a server offset (offsets are opaque otherwise). `behind`: the
    end is not the tail. Either is None when unknown.
    """

    stream: str
    records: int | None
    behind: bool | None

    def __str__(self) -> str:
        if self.behind is None:
            return f"{self.stream}=?"
        if self.records is None:
            return f"{self.stream}=behind"
        return f"{self.stream}={self.records}"


def _worst(streams: Iterable[StreamLag], n: int) -> list[StreamLag]:
    """The `n` streams furthest behind: known counts first, largest first, then by name."""
    behind = [s for s in streams if s.behind]
    behind.sort(key=lambda s: (s.records is None, -(s.records or 0), s.stream))
    return behind[:n]


def _summary(streams: Sequence[StreamLag], total: int | None, behind: int | None,
             worst: int) -> str:
    if behind is None:
        return f"lag unknown: {NO_LATEST_OFFSET}; {len(streams)} streams"
    text = f"lag {'unknown' if total is None else total}, {behind}/{len(streams)} streams behind"
    top = _worst(streams, worst)
    return text + (f", worst {', '.join(map(str, top))}" if top else "")


@dataclass(frozen=True)
class SourceLag:
    """The lag of one of our sources: `index` is its place in the progress's `sources`.

    `total` sums the streams' `records` (None when any is unknown); `behind` counts the
    streams behind their tails (None when the progress has no `latestOffset`)."""

    index: int
    description: str
    format: Format
    streams: Mapping[str, StreamLag]
    total: int | None = field(init=False)
    behind: int | None = field(init=False)

    def __post_init__(self) -> None:
        lags = self.streams.values()
        counts = [s.records for s in lags]
        flags = [s.behind for s in lags]
        total = None if None in counts else sum(c or 0 for c in counts)
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "behind", None if None in flags else sum(map(bool, flags)))

    def worst(self, n: int = WORST) -> list[StreamLag]:
        return _worst(self.streams.values(), n)

    def describe(self, worst: int = WORST) -> str:
        streams = list(self.streams.values())
        return f"{self.format}[{self.index}]: {_summary(streams, self.total, self.behind, worst)}"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class QueryLag:
    """The lag of every one of our sources in one progress of a query."""

    query_id: str
    name: str | None
    batch_id: int | None
    timestamp: str | None
    sources: tuple[SourceLag, ...]

    @property
    def total(self) -> int | None:
        """Records behind over all our sources; None when any source's count is unknown."""
        totals = [s.total for s in self.sources]
        return None if None in totals else sum(t or 0 for t in totals)

    @property
    def behind(self) -> int | None:
        """Streams behind over all our sources; None when unknown."""
        counts = [s.behind for s in self.sources]
        return None if None in counts else sum(c or 0 for c in counts)

    @property
    def streams(self) -> list[StreamLag]:
        return [lag for source in self.sources for lag in source.streams.values()]

    def describe(self, worst: int = WORST) -> str:
        """One line: `query NAME (id ID) batch N: lag T, B/S streams behind, worst ...`."""
        who = f"{self.name} (id {self.query_id})" if self.name else self.query_id
        head = f"query {who} batch {self.batch_id}"
        if not self.sources:
            return f"{head}: no s2 or durable-streams sources"
        return f"{head}: {_summary(self.streams, self.total, self.behind, worst)}"

    def __str__(self) -> str:
        return self.describe()


# -- reading a progress -----------------------------------------------------------------


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _offsets(value: Any) -> dict[str, Any] | None:
    """A source offset as `{stream: position}`; None when absent. Progresses carry offsets
    as JSON text (PySpark 4.0's `lastProgress`: the repr of a dict; a listener on 4.0/4.1:
    "None" for an absent one) or, parsed, as dicts; a compact offset is decoded. Raises
    ValueError on anything else."""
    if value is None or value in ("", "null", "None"):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise ValueError(f"not an offset: {value[:80]!r}") from None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"not a map of streams: {str(value)[:80]!r}")
    return decode_offset(value)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shape(offsets: Mapping[str, Any]) -> Format | None:
    """Which of our formats `offsets` (non-empty) is written in, if any."""
    values = list(offsets.values())
    if all(_is_count(v) for v in values):
        return "s2"
    if all(isinstance(v, Mapping) and isinstance(v.get("offset"), str)
           and _is_count(v.get("skip")) and set(v) <= _DURABLE_KEYS for v in values):
        return "durable-streams"
    return None


def _s2_lag(stream: str, tail: Any, end: Mapping[str, Any]) -> StreamLag:
    """Records between the batch's end (0 for a stream not read yet) and the tail; a tail
    before the end (a stream recreated or trimmed) counts as 0."""
    records = max(0, tail - end.get(stream, 0))
    return StreamLag(stream, records, records > 0)


def _durable_lag(stream: str, tail: Mapping[str, Any], end: Mapping[str, Any]) -> StreamLag:
    """Behind unless the end is the tail; a count only within one server offset."""
    pos = end.get(stream, _DURABLE_ORIGIN)
    if tail["offset"] != pos["offset"]:
        return StreamLag(stream, None, True)
    records = max(0, tail["skip"] - pos["skip"])
    return StreamLag(stream, records, records > 0)


def _source_lag(index: int, source: Any) -> SourceLag | None:
    """The lag of `source` if it is one of ours, else None."""
    description = str(_field(source, "description") or "")
    if _PYTHON_STREAM not in description:
        return None
    try:
        start, end, latest = (_offsets(_field(source, key))
                              for key in ("startOffset", "endOffset", "latestOffset"))
    except ValueError:
        return None
    shapes = {_shape(o) for o in (start, end, latest) if o}
    if len(shapes) != 1 or None in shapes:
        return None  # not ours, or no stream yet to tell the format by
    fmt: Format = shapes.pop()  # type: ignore[assignment]
    end = end or {}
    if latest is None:
        streams = {s: StreamLag(s, None, None) for s in sorted({*(start or {}), *end})}
    else:
        lag = _s2_lag if fmt == "s2" else _durable_lag
        streams = {s: lag(s, latest[s], end) for s in sorted(latest)}
    return SourceLag(index, description, fmt, streams)


def _as_progress(progress: Any) -> Any:
    if isinstance(progress, (str, bytes)):
        try:
            progress = json.loads(progress)
        except json.JSONDecodeError:
            raise ValueError("lag_of: the text given is not a progress's JSON") from None
    if isinstance(_field(progress, "sources"), (list, tuple)):
        return progress
    raise ValueError(
        "lag_of takes a streaming progress (query.lastProgress, an item of "
        "query.recentProgress, a listener event's .progress, or its JSON); got "
        f"{type(progress).__name__}"
    )


def lag_of(progress: Any) -> QueryLag | None:
    """The lag per stream of each `s2` and `durable-streams` source in `progress`.

    Sources that are not ours are left out, and so is one of ours whose offsets name no
    stream yet. None (the lag is unknown) for None: `query.lastProgress` before the
    query's first progress. Raises ValueError when `progress` is not a streaming progress."""
    if progress is None:
        return None
    progress = _as_progress(progress)
    sources = [_source_lag(i, s) for i, s in enumerate(_field(progress, "sources"))]
    batch = _field(progress, "batchId")
    name = _field(progress, "name")
    return QueryLag(
        query_id=str(_field(progress, "id")),
        name=str(name) if name else None,
        batch_id=int(batch) if batch is not None else None,
        timestamp=_field(progress, "timestamp"),
        sources=tuple(s for s in sources if s is not None),
    )
