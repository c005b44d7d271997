"""Basins, streams and their records, in memory, optionally journaled to a directory.

Everything here runs on the server's one event loop, so there are no locks. A stream
keeps each record as its encoded ReadBatch entry plus parallel arrays of timestamps and
cumulative metered sizes, so reads bisect and join bytes. With a data directory, every
change is appended to one journal with a single `os.write` before it is acknowledged,
so acknowledged appends survive the process being killed.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from s2_spark.testing._errors import ApiError
from s2_spark.testing._records import (
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    MAX_FENCING_TOKEN_BYTES,
    encode_entries,
)

__all__ = ["AppendRecord", "Basin", "Store", "Stream"]

DEFAULT_RETENTION_SECS = 7 * 24 * 3600
TIMESTAMPING_MODES = ("client-prefer", "client-require", "arrival")
STORAGE_CLASSES = ("standard", "express")

# (timestamp or None, headers, body)
AppendRecord = tuple[int | None, list[tuple[bytes, bytes]], bytes]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------- configuration


def default_stream_config() -> dict[str, Any]:
    return {
        "storage_class": "express",
        "retention_policy": {"age": DEFAULT_RETENTION_SECS},
        "timestamping": {"mode": "client-prefer", "uncapped": False},
        "delete_on_empty": {"min_age_secs": 0},
    }


def default_basin_config() -> dict[str, Any]:
    return {
        "default_stream_config": default_stream_config(),
        "create_stream_on_append": False,
        "create_stream_on_read": False,
    }


def _bad_config(message: str) -> ApiError:
    return ApiError.bad("bad_json", message)


def _expect_obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad_config(f"{what} must be a JSON object")
    return value


def apply_stream_config(base: dict[str, Any], update: Any) -> dict[str, Any]:
    """Apply a StreamConfig / StreamReconfiguration: absent keeps, null resets, value sets."""
    if update is None:
        return base
    update = _expect_obj(update, "stream config")
    out: dict[str, Any] = json.loads(json.dumps(base))
    defaults = default_stream_config()
    for key, value in update.items():
        if key == "storage_class":
            if value is None:
                out[key] = defaults[key]
            elif value in STORAGE_CLASSES:
                out[key] = value
            else:
                raise _bad_config(f"storage_class must be one of {list(STORAGE_CLASSES)}")
        elif key == "retention_policy":
            if value is None:
                out[key] = defaults[key]
                continue
            value = _expect_obj(value, "retention_policy")
            if "age" in value and len(value) == 1:
                age = value["age"]
                if not isinstance(age, int) or isinstance(age, bool) or age < 0:
                    raise _bad_config("retention_policy.age must be a non-negative integer")
                if age == 0:
                    raise ApiError.invalid("age must be greater than 0 seconds")
                out[key] = {"age": age}
            elif "infinite" in value and len(value) == 1:
                out[key] = {"infinite": {}}
            else:
                raise _bad_config('retention_policy must be {"age": secs} or {"infinite": {}}')
        elif key == "timestamping":
            if value is None:
                out[key] = defaults[key]
                continue
            value = _expect_obj(value, "timestamping")
            ts = out[key]
            for tkey, tval in value.items():
                if tkey == "mode":
                    if tval is None:
                        ts["mode"] = "client-prefer"
                    elif tval in TIMESTAMPING_MODES:
                        ts["mode"] = tval
                    else:
                        raise _bad_config(
                            f"timestamping.mode must be one of {list(TIMESTAMPING_MODES)}"
                        )
                elif tkey == "uncapped":
                    if tval is not None and not isinstance(tval, bool):
                        raise _bad_config("timestamping.uncapped must be a boolean")
                    ts["uncapped"] = bool(tval)
                else:
                    raise _bad_config(f"unknown field timestamping.{tkey}")
        elif key == "delete_on_empty":
            if value is None:
                out[key] = defaults[key]
                continue
            value = _expect_obj(value, "delete_on_empty")
            age = value.get("min_age_secs", 0)
            if age is None:
                age = 0
            if not isinstance(age, int) or isinstance(age, bool) or age < 0:
                raise _bad_config("delete_on_empty.min_age_secs must be a non-negative integer")
            out[key] = {"min_age_secs": age}
        else:
            raise _bad_config(f"unknown stream config field {key!r}")
    return out


def apply_basin_config(base: dict[str, Any], update: Any) -> dict[str, Any]:
    """Apply a BasinConfig / BasinReconfiguration to `base`."""
    if update is None:
        return base
    update = _expect_obj(update, "basin config")
    out: dict[str, Any] = json.loads(json.dumps(base))
    for key, value in update.items():
        if key == "default_stream_config":
            out[key] = (
                default_stream_config() if value is None else apply_stream_config(out[key], value)
            )
        elif key in ("create_stream_on_append", "create_stream_on_read"):
            if value is not None and not isinstance(value, bool):
                raise _bad_config(f"{key} must be a boolean")
            out[key] = bool(value)
        elif key == "stream_cipher":
            if value is not None:
                raise ApiError.standard(
                    501, "not_implemented", "encryption is not supported by the local server"
                )
        else:
            raise _bad_config(f"unknown basin config field {key!r}")
    return out


# ---------------------------------------------------------------- names


def validate_basin_name(name: str, what: str = "name") -> None:
    """S2's basin name rules (8-48 bytes of [a-z0-9-], no hyphen at either end)."""
    if len(name.encode()) > 48:
        raise ApiError.invalid(f"basin {what} must not exceed 48 bytes in length")
    if len(name.encode()) < 8:
        raise ApiError.invalid(f"basin {what} should be at least 8 bytes in length")
    if not (name[0].islower() or name[0].isdigit()) or not name[0].isascii():
        raise ApiError.invalid(f"basin {what} must begin with a lowercase letter or number")
    if not (name[-1].islower() or name[-1].isdigit()) or not name[-1].isascii():
        raise ApiError.invalid(f"basin {what} must end with a lowercase letter or number")
    for c in name:
        if not (c.isascii() and (c.islower() or c.isdigit() or c == "-")):
            raise ApiError.invalid(
                f"basin {what} must comprise lowercase letters, numbers, and hyphens"
            )


def validate_stream_name(name: str, what: str = "name") -> None:
    """S2's stream name rules: 1-512 bytes, not "." or ".."."""
    if not name:
        raise ApiError.invalid(f"stream {what} must not be empty")
    if name in (".", ".."):
        raise ApiError.invalid(f'stream {what} must not be "." or ".."')
    if len(name.encode()) > 512:
        raise ApiError.invalid(f"stream {what} must not exceed 512 bytes in length")


# ---------------------------------------------------------------- journal

_ENTRY_HEAD = struct.Struct("<BI")  # kind, payload length; then payload, then crc32
_KIND_META = ord("M")
_KIND_APPEND = ord("A")
_APPEND_HEAD = struct.Struct("<IIQ")  # stream id, record count, arrival time (ms)
_APPEND_REC = struct.Struct("<QII")  # timestamp, metered size, entry length


def _journal_entry(kind: int, payload: bytes) -> bytes:
    return _ENTRY_HEAD.pack(kind, len(payload)) + payload + struct.pack("<I", zlib.crc32(payload))


def _meta_entry(op: dict[str, Any]) -> bytes:
    return _journal_entry(_KIND_META, json.dumps(op, separators=(",", ":")).encode())


class Journal:
    """One append-only file of changes; replayed on start, a torn tail is cut off."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "journal.bin"
        self._fd = -1

    def replay(self) -> list[tuple[int, bytes]]:
        entries: list[tuple[int, bytes]] = []
        if not self.path.exists():
            return entries
        data = self.path.read_bytes()
        pos, size = 0, len(data)
        while pos + _ENTRY_HEAD.size <= size:
            kind, length = _ENTRY_HEAD.unpack_from(data, pos)
            end = pos + _ENTRY_HEAD.size + length + 4
            if end > size:
                break
            payload = data[pos + _ENTRY_HEAD.size : end - 4]
            if struct.unpack_from("<I", data, end - 4)[0] != zlib.crc32(payload):
                break
            entries.append((kind, payload))
            pos = end
        if pos != size:
            with open(self.path, "r+b") as f:
                f.truncate(pos)
        return entries

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# ---------------------------------------------------------------- streams


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
    deleted: bool = False
    request_token: str | None = None
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

    def _notify(self) -> None:
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
    ) -> tuple[list[bytes], list[int], list[int], list[tuple[int, bytes]]]:
        """Check conditions and sequence a batch. Nothing changes until `commit`."""
        if fencing_token is not None and fencing_token != self.fencing_token:
            raise ApiError(412, {"fencing_token_mismatch": self.fencing_token})
        first = self.next_seq
        if match_seq_num is not None and match_seq_num != first:
            raise ApiError(412, {"seq_num_mismatch": first})
        ts_cfg = self.config["timestamping"]
        mode = ts_cfg["mode"]
        uncapped = ts_cfg.get("uncapped", False)
        max_ts = self.last_ts
        if (
            mode != "client-require"
            and not any(r[1] for r in records)
            and (mode == "arrival" or all(r[0] is None for r in records))
        ):
            # The usual batch: no headers, no client timestamps. One timestamp for all.
            t = max(now, max_ts)
            n = len(records)
            bodies = [r[2] for r in records]
            return (
                encode_entries(first, [t] * n, records),
                [t] * n,
                [8 + len(b) for b in bodies],
                [],
            )
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
                    raise ApiError.invalid(
                        "client timestamp is required by the stream's timestamping mode"
                    )
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
        self._notify()

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "created_at": self.created_at, "deleted_at": None}


@dataclass(eq=False)
class Basin:
    name: str
    config: dict[str, Any]
    created_at: str
    request_token: str | None = None
    streams: dict[str, Stream] = field(default_factory=dict)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "scope": "aws:us-east-1",
            "created_at": self.created_at,
            "deleted_at": None,
            "state": "active",
        }


class Store:
    """All basins and streams; journals every change when given a directory."""

    def __init__(self, data_dir: str | Path | None = None, clock: Callable[[], int] = now_ms):
        self.basins: dict[str, Basin] = {}
        self.clock = clock
        self._streams_by_id: dict[int, Stream] = {}
        self._next_stream_id = 1
        self._journal: Journal | None = None
        if data_dir is not None:
            self._journal = Journal(Path(data_dir))
            self._replay(self._journal.replay())
            self._journal.open()

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    # -- journal

    def _write(self, data: bytes) -> None:
        if self._journal is not None:
            self._journal.write(data)

    def _replay(self, entries: list[tuple[int, bytes]]) -> None:
        for kind, payload in entries:
            if kind == _KIND_META:
                self._apply_meta(json.loads(payload))
            elif kind == _KIND_APPEND:
                sid, count, arrival = _APPEND_HEAD.unpack_from(payload, 0)
                stream = self._streams_by_id.get(sid)
                if stream is None:
                    continue
                pos = _APPEND_HEAD.size
                heads = []
                for _ in range(count):
                    heads.append(_APPEND_REC.unpack_from(payload, pos))
                    pos += _APPEND_REC.size
                entries_: list[bytes] = []
                for _, _, length in heads:
                    entries_.append(payload[pos : pos + length])
                    pos += length
                stream.commit(entries_, [h[0] for h in heads], [h[1] for h in heads], [], arrival)

    def _apply_meta(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "create_basin":
            self.basins[op["name"]] = Basin(
                op["name"], op["config"], op["created_at"], op.get("request_token")
            )
        elif kind == "delete_basin":
            basin = self.basins.pop(op["name"], None)
            if basin is not None:
                for s in basin.streams.values():
                    self._drop_stream(s)
        elif kind == "basin_config":
            self.basins[op["name"]].config = op["config"]
        elif kind == "create_stream":
            sid = op["id"]
            stream = Stream(sid, op["basin"], op["name"], op["config"], op["created_at"])
            stream.request_token = op.get("request_token")
            self.basins[op["basin"]].streams[op["name"]] = stream
            self._streams_by_id[sid] = stream
            self._next_stream_id = max(self._next_stream_id, sid + 1)
        elif kind == "delete_stream":
            stream_ = self._streams_by_id.get(op["id"])
            if stream_ is not None:
                self.basins[stream_.basin].streams.pop(stream_.name, None)
                self._drop_stream(stream_)
        elif kind == "stream_config":
            self._streams_by_id[op["id"]].config = op["config"]
        elif kind == "fence":
            self._streams_by_id[op["id"]].fencing_token = op["token"]
        elif kind == "trim":
            s = self._streams_by_id[op["id"]]
            s.trim_point = max(s.trim_point, op["point"])

    def _meta(self, op: dict[str, Any]) -> None:
        """Journal a metadata change, then apply it."""
        self._write(_meta_entry(op))
        self._apply_meta(op)

    def _drop_stream(self, stream: Stream) -> None:
        stream.deleted = True
        self._streams_by_id.pop(stream.id, None)
        stream._notify()

    # -- basins

    def basin(self, name: str) -> Basin:
        basin = self.basins.get(name)
        if basin is None:
            raise ApiError.standard(404, "basin_not_found", f"basin {name} not found")
        return basin

    def create_basin(
        self, name: str, config: Any, *, request_token: str | None = None
    ) -> tuple[Basin, bool]:
        """Create a basin; returns (basin, created). Same request token again is a no-op."""
        validate_basin_name(name)
        existing = self.basins.get(name)
        if existing is not None:
            key = _idempotency_key(request_token, config)
            if key is not None and existing.request_token == key:
                return existing, False
            raise ApiError.standard(409, "resource_already_exists", f"basin {name} already exists")
        cfg = apply_basin_config(default_basin_config(), config)
        self._meta(
            {
                "op": "create_basin",
                "name": name,
                "config": cfg,
                "created_at": _rfc3339(),
                "request_token": _idempotency_key(request_token, config),
            }
        )
        return self.basins[name], True

    def ensure_basin(self, name: str, config: Any) -> tuple[Basin, str]:
        """PUT semantics: create, or reconfigure; returns the provision result."""
        validate_basin_name(name)
        basin = self.basins.get(name)
        if basin is None:
            basin, _ = self.create_basin(name, config)
            return basin, "created"
        # As in s2-lite, the desired config replaces the current one (defaults fill gaps).
        new = apply_basin_config(default_basin_config(), config)
        if new == basin.config:
            return basin, "noop"
        self._meta({"op": "basin_config", "name": name, "config": new})
        return basin, "updated"

    def reconfigure_basin(self, name: str, update: Any) -> Basin:
        basin = self.basin(name)
        new = apply_basin_config(basin.config, update)
        if new != basin.config:
            self._meta({"op": "basin_config", "name": name, "config": new})
        return basin

    def delete_basin(self, name: str) -> None:
        self.basin(name)
        self._meta({"op": "delete_basin", "name": name})

    # -- streams

    def stream(self, basin_name: str, name: str, *, auto_create: str | None = None) -> Stream:
        """Look a stream up; `auto_create` names the basin flag that may create it."""
        basin = self.basin(basin_name)
        stream = basin.streams.get(name)
        if stream is None:
            if auto_create is not None and basin.config.get(auto_create):
                stream, _ = self.create_stream(basin_name, name, None)
                return stream
            raise ApiError.standard(404, "stream_not_found", f"stream {name} not found")
        return stream

    def create_stream(
        self,
        basin_name: str,
        name: str,
        config: Any,
        *,
        exist_ok: bool = False,
        request_token: str | None = None,
    ) -> tuple[Stream, bool]:
        """Create a stream; returns (stream, created). A retry with the same request
        token and config is a no-op, as in s2-lite."""
        validate_stream_name(name)
        basin = self.basin(basin_name)
        existing = basin.streams.get(name)
        key = _idempotency_key(request_token, config)
        if existing is not None:
            if exist_ok or (key is not None and existing.request_token == key):
                return existing, False
            raise ApiError.standard(409, "resource_already_exists", f"stream {name} already exists")
        cfg = apply_stream_config(basin.config["default_stream_config"], config)
        sid = self._next_stream_id
        self._meta(
            {
                "op": "create_stream",
                "id": sid,
                "basin": basin_name,
                "name": name,
                "config": cfg,
                "created_at": _rfc3339(),
                "request_token": key,
            }
        )
        return basin.streams[name], True

    def ensure_stream(self, basin_name: str, name: str, config: Any) -> tuple[Stream, str]:
        validate_stream_name(name)
        basin = self.basin(basin_name)
        stream = basin.streams.get(name)
        if stream is None:
            stream, _ = self.create_stream(basin_name, name, config)
            return stream, "created"
        # As in s2-lite, the desired config replaces the current one (basin defaults
        # fill gaps); PATCH is the way to change single fields.
        new = apply_stream_config(basin.config["default_stream_config"], config)
        if new == stream.config:
            return stream, "noop"
        self._meta({"op": "stream_config", "id": stream.id, "config": new})
        return stream, "updated"

    def reconfigure_stream(self, basin_name: str, name: str, update: Any) -> Stream:
        stream = self.stream(basin_name, name)
        new = apply_stream_config(stream.config, update)
        if new != stream.config:
            self._meta({"op": "stream_config", "id": stream.id, "config": new})
        return stream

    def delete_stream(self, basin_name: str, name: str) -> None:
        stream = self.stream(basin_name, name)
        self._meta({"op": "delete_stream", "id": stream.id})

    # -- records

    def append(
        self,
        stream: Stream,
        records: list[AppendRecord],
        match_seq_num: int | None,
        fencing_token: str | None,
    ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """Append a validated batch; returns (start, end, tail) positions."""
        if stream.deleted:
            raise ApiError.standard(404, "stream_not_found", f"stream {stream.name} not found")
        now = self.clock()
        entries, timestamps, metered, commands = stream.prepare_append(
            records, match_seq_num, fencing_token, now
        )
        effects: list[tuple[str, Any]] = []
        meta: list[bytes] = []
        for seq, _op in commands:
            kind, value = _command_effect(records[seq - stream.next_seq])
            if kind == "trim":
                value = min(value, seq + 1)
            effects.append((kind, value))
            key = "token" if kind == "fence" else "point"
            meta.append(_meta_entry({"op": kind, "id": stream.id, key: value}))
        if self._journal is not None:
            parts = [_APPEND_HEAD.pack(stream.id, len(entries), now)]
            parts.extend(
                _APPEND_REC.pack(t, m, len(e))
                for t, m, e in zip(timestamps, metered, entries, strict=True)
            )
            parts.extend(entries)
            self._write(_journal_entry(_KIND_APPEND, b"".join(parts)) + b"".join(meta))
        start = (stream.next_seq, timestamps[0])
        stream.commit(entries, timestamps, metered, effects, now)
        end = (stream.next_seq, stream.last_ts)
        return start, end, end


def _idempotency_key(request_token: str | None, config: Any) -> str | None:
    """A create is a no-op retry when both its request token and its config match."""
    if request_token is None:
        return None
    return request_token + "\n" + json.dumps(config, sort_keys=True)


def _command_effect(record: AppendRecord) -> tuple[str, Any]:
    _, headers, body = record
    op = headers[0][1]
    if op == b"fence":
        return "fence", body.decode()
    return "trim", int.from_bytes(body, "big")


def validate_records(records: list[AppendRecord]) -> None:
    """S2's batch rules: 1-1000 records, each and all <= 1 MiB metered, valid commands."""
    if not records:
        raise ApiError.invalid("record batch must not be empty")
    if len(records) > MAX_BATCH_RECORDS:
        raise ApiError.invalid("record batch must not exceed 1000 records")
    if not any(r[1] for r in records):
        # No headers, so no command records: sizes are 8 + body length.
        lengths = [len(r[2]) for r in records]
        if max(lengths) + 8 > MAX_BATCH_BYTES:
            raise ApiError.invalid("record must have metered size less than 1 MiB")
        if sum(lengths) + 8 * len(lengths) > MAX_BATCH_BYTES:
            raise ApiError.invalid("record batch must not exceed a metered size of 1 MiB")
        return
    total = 0
    for _, headers, body in records:
        size = 8 + len(body)
        if headers:
            for name, value in headers:
                size += 2 + len(name) + len(value)
            for name, _ in headers:
                if not name:
                    _validate_command(headers, body)
                    break
        if size > MAX_BATCH_BYTES:
            raise ApiError.invalid("record must have metered size less than 1 MiB")
        total += size
    if total > MAX_BATCH_BYTES:
        raise ApiError.invalid("record batch must not exceed a metered size of 1 MiB")


def _validate_command(headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    if len(headers) != 1:
        raise ApiError.invalid("invalid header: name cannot be empty")
    op = headers[0][1]
    if op == b"fence":
        try:
            token = body.decode()
        except UnicodeDecodeError as e:
            raise ApiError.invalid("invalid `fence` command: invalid UTF-8") from e
        if len(token.encode()) > MAX_FENCING_TOKEN_BYTES:
            raise ApiError.invalid(
                f"invalid `fence` command: fencing token must not exceed "
                f"{MAX_FENCING_TOKEN_BYTES} bytes in length"
            )
    elif op == b"trim":
        if len(body) != 8:
            raise ApiError.invalid(
                f"invalid `trim` command: earliest sequence number to trim to was "
                f"{len(body)} bytes, must be 8"
            )
    else:
        raise ApiError.invalid("unknown command")


def validate_fencing_token(token: str | None) -> None:
    if token is not None and len(token.encode()) > MAX_FENCING_TOKEN_BYTES:
        raise ApiError.invalid(
            f"fencing token must not exceed {MAX_FENCING_TOKEN_BYTES} bytes in length"
        )
