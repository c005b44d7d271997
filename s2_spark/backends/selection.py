"""Which streams a read selects: a fixed list, or every stream with a prefix (no pyspark)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["StreamSelection"]


@dataclass(frozen=True, slots=True)
class StreamSelection:
    """A fixed list of stream names, or (where the service can list streams) a prefix."""

    streams: tuple[str, ...] = ()
    prefix: str | None = None
    # `streams` as a set: a plan asks `matches` of every stream, and a tuple of 100,000
    # names made that 100,000 times 100,000 comparisons.
    _named: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_named", frozenset(self.streams))

    def matches(self, stream: str) -> bool:
        if self.prefix is not None:
            return stream.startswith(self.prefix)
        return stream in self._named
