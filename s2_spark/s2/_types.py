"""Plain value types of the client API: records to append, acks, stream info and config."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from s2_spark.errors import Position
from s2_spark.wire._limits import MAX_BATCH_BYTES, MAX_BATCH_RECORDS

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "AppendAck",
    "AppendRecord",
    "BasinInfo",
    "ReadLimits",
    "StreamConfig",
    "StreamInfo",
]

MAX_FENCING_TOKEN_BYTES = 36

StorageClass = Literal["standard", "express"]
TimestampingMode = Literal["client-prefer", "client-require", "arrival"]


def _as_bytes(what: str, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"AppendRecord {what} must be bytes or str (got {type(value).__name__})")


@dataclass(frozen=True, slots=True)
class AppendRecord:
    """A record to append. `timestamp` is u64 milliseconds (None lets the service stamp it)."""

    body: bytes
    headers: Sequence[tuple[bytes, bytes]] = ()
    timestamp: int | None = None

    def __post_init__(self) -> None:
        # Fast path first: the common record is bytes with no headers and no timestamp.
        if type(self.body) is not bytes:
            object.__setattr__(self, "body", _as_bytes("body", self.body))
        headers = self.headers
        if headers:
            object.__setattr__(
                self,
                "headers",
                tuple(
                    (_as_bytes("header name", n), _as_bytes("header value", v)) for n, v in headers
                ),
            )
        elif type(headers) is not tuple:
            object.__setattr__(self, "headers", ())
        ts = self.timestamp
        if ts is not None and (
            isinstance(ts, bool) or not isinstance(ts, int) or not 0 <= ts < 2**64
        ):
            raise ValueError(f"AppendRecord timestamp must be a u64 of milliseconds (got {ts!r})")

    @property
    def metered_bytes(self) -> int:
        """S2's metered size: 8 + 2 * headers + header name/value lengths + body length."""
        return (
            8
            + 2 * len(self.headers)
            + sum(len(n) + len(v) for n, v in self.headers)
            + len(self.body)
        )

    @property
    def is_command(self) -> bool:
        """Whether this is a command record (one header with an empty name)."""
        return len(self.headers) == 1 and self.headers[0][0] == b""

    @classmethod
    def fence(cls, token: str, *, timestamp: int | None = None) -> AppendRecord:
        """A `fence` command record setting the stream's fencing token ("" clears it)."""
        raw = token.encode()
        if len(raw) > MAX_FENCING_TOKEN_BYTES:
            raise ValueError(
                f"fencing token is {len(raw)} bytes; S2 accepts at most "
                f"{MAX_FENCING_TOKEN_BYTES} UTF-8 bytes"
            )
        return cls(raw, ((b"", b"fence"),), timestamp)

    @classmethod
    def trim(cls, earliest_seq_num: int, *, timestamp: int | None = None) -> AppendRecord:
        """A `trim` command record asking S2 to drop records before `earliest_seq_num`."""
        if (
            isinstance(earliest_seq_num, bool)
            or not isinstance(earliest_seq_num, int)
            or not (0 <= earliest_seq_num < 2**64)
        ):
            raise ValueError(f"trim point must be a u64 sequence number (got {earliest_seq_num!r})")
        return cls(earliest_seq_num.to_bytes(8, "big"), ((b"", b"trim"),), timestamp)


@dataclass(frozen=True, slots=True)
class AppendAck:
    """Where an append landed: records [start.seq_num, end.seq_num) and the tail after it."""

    start: Position
    end: Position
    tail: Position

    @property
    def count(self) -> int:
        return self.end.seq_num - self.start.seq_num


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One stream of a basin as listed; times are RFC 3339 strings. `cipher`: the stream
    cipher its records are encrypted with (`aegis-256`, `aes-256-gcm`), None if none."""

    name: str
    created_at: str
    deleted_at: str | None = None
    cipher: str | None = None


@dataclass(frozen=True, slots=True)
class BasinInfo:
    """One basin of the account as listed. `location` is where it lives (None on s2-lite);
    servers older than S2's `location` field send `scope`, read into it the same way."""

    name: str
    created_at: str | None = None
    deleted_at: str | None = None
    state: str | None = None
    location: str | None = None


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Stream settings. None leaves a setting at the service default.

    `retention_age`: seconds records are kept; `infinite_retention=True` keeps them until
    trimmed (the two are exclusive). `delete_on_empty_min_age`: seconds (0 disables).
    """

    storage_class: StorageClass | None = None
    retention_age: int | None = None
    infinite_retention: bool = False
    timestamping_mode: TimestampingMode | None = None
    timestamping_uncapped: bool | None = None
    delete_on_empty_min_age: int | None = None

    def __post_init__(self) -> None:
        if self.storage_class not in (None, "standard", "express"):
            raise ValueError(
                f"StreamConfig.storage_class must be 'standard' or 'express' "
                f"(got {self.storage_class!r})"
            )
        if self.timestamping_mode not in (None, "client-prefer", "client-require", "arrival"):
            raise ValueError(
                "StreamConfig.timestamping_mode must be 'client-prefer', 'client-require' "
                f"or 'arrival' (got {self.timestamping_mode!r})"
            )
        if self.retention_age is not None and (
            isinstance(self.retention_age, bool)
            or not isinstance(self.retention_age, int)
            or self.retention_age <= 0
        ):
            raise ValueError(
                f"StreamConfig.retention_age must be seconds > 0 (got {self.retention_age!r})"
            )
        if self.retention_age is not None and self.infinite_retention:
            raise ValueError(
                "StreamConfig: set either retention_age or infinite_retention, not both"
            )

    def to_json(self) -> dict[str, Any]:
        """The JSON object S2 expects (only the settings that were given)."""
        out: dict[str, Any] = {}
        if self.storage_class is not None:
            out["storage_class"] = self.storage_class
        if self.infinite_retention:
            out["retention_policy"] = {"infinite": {}}
        elif self.retention_age is not None:
            out["retention_policy"] = {"age": self.retention_age}
        ts: dict[str, Any] = {}
        if self.timestamping_mode is not None:
            ts["mode"] = self.timestamping_mode
        if self.timestamping_uncapped is not None:
            ts["uncapped"] = self.timestamping_uncapped
        if ts:
            out["timestamping"] = ts
        if self.delete_on_empty_min_age is not None:
            out["delete_on_empty"] = {"min_age_secs": self.delete_on_empty_min_age}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> StreamConfig:
        """Parse S2's JSON stream config (unknown fields are ignored)."""
        data = data or {}
        retention = data.get("retention_policy") or {}
        ts = data.get("timestamping") or {}
        doe = data.get("delete_on_empty") or {}
        return cls(
            storage_class=data.get("storage_class"),
            retention_age=retention.get("age") if "age" in retention else None,
            infinite_retention="infinite" in retention,
            timestamping_mode=ts.get("mode"),
            timestamping_uncapped=ts.get("uncapped"),
            delete_on_empty_min_age=doe.get("min_age_secs"),
        )


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Bounds of a read: at most `count` records / `bytes` metered bytes, stop before `until`.

    None means unbounded (a unary read is still capped by S2 at 1000 records / 1 MiB).
    """

    count: int | None = None
    bytes: int | None = None
    until: int | None = None

    def __post_init__(self) -> None:
        for name in ("count", "bytes", "until"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"ReadLimits.{name} must be an int >= 0 or None (got {v!r})")
