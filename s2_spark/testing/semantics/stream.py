"""One stream of the local server: its records, kept encoded, and how an append lands.

A stream keeps each record as its encoded ReadBatch entry plus parallel arrays of
timestamps, arrival times and cumulative metered sizes, so reads bisect and join bytes.
An append is checked and sequenced first (`prepare_append`) and applied only after the
store has journaled it (`commit`).
"""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass, field
from typing import Any

from s2_spark.testing.semantics.append_rules import AppendRecord
from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.records import encode_entries

__all__ = ["PreparedAppend", "Stream"]

#: A sequenced batch: (entries, timestamps, metered sizes, command records as (seq, op)).
PreparedAppend = tuple[list[bytes], list[int], list[int], list[tuple[int, bytes]]]


@dataclass(eq=False)
class Stream:
    """One stream: its records (encoded), their timestamps and cumulative metered sizes."""

    id: int
    basin: str
    name: str
    config: dict[str, Any]
    created_at: str
    entries: list[bytes] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    arrivals: list[int] = field(default_factory=list)
    cum: list[int] = field(default_factory=list)
    cum_base: int = 0
    first_seq: int = 0
    next_seq: int = 0
    last_ts: int = 0
    fencing_token: str = ""
    trim_point: int = 0
    #: When the stream was deleted (RFC 3339): deletion pending until the store removes
    #: it; sessions that still hold it end (`deletion.STREAMER_GONE`).
    deleted_at: str | None = None
    request_token: str | None = None
    #: The basin's `stream_cipher` when the stream was created, fixed for its life: its
    #: records other than command records are stored sealed (`encryption`).
    cipher: str | None = None
    _changed: asyncio.Event | None = None

    # -- reads

    @property
    def tail(self) -> tuple[int, int]:
        return self.next_seq, self.last_ts

    def changed_event(self) -> asyncio.Event:
        """An event set at the next append (or deletion) of this stream."""
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def notify(self) -> None:
        """Wake the readers waiting on `changed_event`."""
        ev, self._changed = self._changed, None
        if ev is not None:
            ev.set()

    def cum_before(self, index: int) -> int:
        return self.cum[index - 1] if index > 0 else self.cum_base

    def apply_retention(self, now: int) -> None:
        """Drop records below the trim point or older than the retention age."""
        cut = max(self.trim_point - self.first_seq, 0)
        age = self.config["retention_policy"].get("age")
        if age is not None and self.arrivals:
            # Like s2-lite's storage TTL: age counts from when a record was written.
            cut = max(cut, bisect.bisect_left(self.arrivals, now - age * 1000 + 1))
        if cut > 0:
            cut = min(cut, len(self.entries))
            self.cum_base = self.cum[cut - 1]
            del self.entries[:cut]
            del self.timestamps[:cut]
            del self.arrivals[:cut]
            del self.cum[:cut]
            self.first_seq += cut

    def seq_for_timestamp(self, timestamp: int) -> int:
        """The first retained record at or after `timestamp`, else the tail."""
        i = bisect.bisect_left(self.timestamps, timestamp)
        return self.first_seq + i if i < len(self.timestamps) else self.next_seq

    # -- appends

    def prepare_append(
        self,
        records: list[AppendRecord],
        match_seq_num: int | None,
        fencing_token: str | None,
        now: int,
    ) -> PreparedAppend:
        """Check conditions and sequence a batch. Nothing changes until `commit`."""
        if fencing_token is not None and fencing_token != self.fencing_token:
            raise ApiError(412, {"fencing_token_mismatch": self.fencing_token})
        first = self.next_seq
        if match_seq_num is not None and match_seq_num != first:
            raise ApiError(412, {"seq_num_mismatch": first})
        ts_cfg = self.config["timestamping"]
        mode = ts_cfg["mode"]
        if (
            mode != "client-require"
            and not any(r[1] for r in records)
            and (mode == "arrival" or all(r[0] is None for r in records))
        ):
            # The usual batch: no headers, no client timestamps. One timestamp for all.
            t = max(now, self.last_ts)
            n = len(records)
            bodies = [r[2] for r in records]
            return (
                encode_entries(first, [t] * n, records),
                [t] * n,
                [8 + len(b) for b in bodies],
                [],
            )
        timestamps, metered, commands = _stamp(
            records, first, mode, ts_cfg.get("uncapped", False), self.last_ts, now
        )
        entries = encode_entries(first, timestamps, records)
        return entries, timestamps, metered, commands

    def commit(
        self,
        entries: list[bytes],
        timestamps: list[int],
        metered: list[int],
        command_effects: list[tuple[str, Any]],
        arrival: int,
    ) -> None:
        total = self.cum[-1] if self.cum else self.cum_base
        cum = self.cum
        for m in metered:
            total += m
            cum.append(total)
        self.entries.extend(entries)
        self.timestamps.extend(timestamps)
        if self.arrivals and arrival < self.arrivals[-1]:
            arrival = self.arrivals[-1]
        self.arrivals.extend([arrival] * len(entries))
        self.next_seq += len(entries)
        self.last_ts = timestamps[-1]
        for kind, value in command_effects:
            if kind == "fence":
                self.fencing_token = value
            elif kind == "trim" and value > self.trim_point:
                self.trim_point = value
        self.notify()

    def info(self) -> dict[str, Any]:
        """As S2 lists it (`api/src/v1/stream/mod.rs`, `StreamInfo`)."""
        return {
            "name": self.name,
            "created_at": self.created_at,
            "deleted_at": self.deleted_at,
            "cipher": self.cipher,
        }


def _stamp(
    records: list[AppendRecord], first: int, mode: str, uncapped: bool, max_ts: int, now: int
) -> tuple[list[int], list[int], list[tuple[int, bytes]]]:
    """Each record's timestamp (by the stream's mode, capped at `now` unless uncapped, never
    below the last), its metered size, and the command records as (seq_num, op)."""
    timestamps: list[int] = []
    metered: list[int] = []
    commands: list[tuple[int, bytes]] = []
    seq = first
    for ts, headers, body in records:
        if mode == "client-prefer":
            t = now if ts is None else ts
        elif mode == "arrival":
            t = now
        else:
            if ts is None:
                raise ApiError.invalid("record timestamp was required but was missing")
            t = ts
        if not uncapped and t > now:
            t = now
        if t < max_ts:
            t = max_ts
        else:
            max_ts = t
        size = 8 + len(body)
        if headers:
            for name, value in headers:
                size += 2 + len(name) + len(value)
            if len(headers) == 1 and not headers[0][0]:
                commands.append((seq, headers[0][1]))
        timestamps.append(t)
        metered.append(size)
        seq += 1
    return timestamps, metered, commands
