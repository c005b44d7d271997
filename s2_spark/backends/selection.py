"""Which streams a read selects: a fixed list, or every stream with a prefix (no pyspark)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StreamSelection"]


@dataclass(frozen=True, slots=True)
class StreamSelection:
    """A fixed list of stream names, or (where the service can list streams) a prefix."""

    streams: tuple[str, ...] = ()
    prefix: str | None = None

    def matches(self, stream: str) -> bool:
        if self.prefix is not None:
            return stream.startswith(self.prefix)
        return stream in self.streams
