"""Basins and their streams, in memory, optionally journaled to a directory.

Everything here runs on the server's one event loop, so there are no locks. With a data
directory, every change is appended to one journal (`journal`) with a single `os.write`
before it is acknowledged, so acknowledged appends survive the process being killed; on
start the journal is replayed. Configurations are checked in `config`, names in
`names`, a stream's records are kept by `stream.Stream`. A deleted stream or basin is
*deletion pending* until a background removal (`deletion`, after its delay) drops it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from s2_spark.testing.semantics.append_rules import AppendRecord, command_effect
from s2_spark.testing.semantics.config import (
    apply_basin_config,
    ensure_basin_config,
    reconfigure_stream_config,
    resolve_stream_config,
)
from s2_spark.testing.semantics.deletion import (
    TERMINAL_TRIM,
    Removals,
    basin_deletion_pending,
    stream_deletion_pending,
    streamer_gone,
)
from s2_spark.testing.semantics.encryption import Sealer
from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.journal import (
    KIND_APPEND,
    KIND_META,
    Journal,
    append_entry,
    decode_append,
    meta_entry,
)
from s2_spark.testing.semantics.names import validate_basin_name, validate_stream_name
from s2_spark.testing.semantics.stream import Stream

__all__ = ["Basin", "Store", "now_ms"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(eq=False)
class Basin:
    name: str
    config: dict[str, Any]
    created_at: str
    request_token: str | None = None
    streams: dict[str, Stream] = field(default_factory=dict)
    deleted_at: str | None = None  # deletion pending since (RFC 3339)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "location": None,  # s2-lite: `api/src/v1/basin.rs` (was `scope`)
            "created_at": self.created_at,
            "deleted_at": self.deleted_at,
            "state": "active" if self.deleted_at is None else "deleting",
        }


class Store:
    """All basins and streams; journals every change when given a directory."""

    def __init__(self, data_dir: str | Path | None = None, clock: Callable[[], int] = now_ms,
                 *, deletion_delay: float = 0.0):
        """`deletion_delay`: seconds a deleted stream or basin stays deletion pending
        before it is removed (s2-lite: as soon as its deletion is durable)."""
        self.basins: dict[str, Basin] = {}
        self.clock = clock
        self.removals = Removals(deletion_delay)
        self._streams_by_id: dict[int, Stream] = {}
        self._next_stream_id = 1
        self._journal: Journal | None = None
        if data_dir is not None:
            self._journal = Journal(Path(data_dir))
            self._replay(self._journal.replay())
            self._journal.open()
            self._resume_deletions()

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()

    # -- journal

    def _write(self, data: bytes) -> None:
        if self._journal is not None:
            self._journal.write(data)

    def _replay(self, entries: list[tuple[int, bytes]]) -> None:
        for kind, payload in entries:
            if kind == KIND_META:
                self._apply_meta(json.loads(payload))
            elif kind == KIND_APPEND:
                sid, arrival, records, timestamps, metered = decode_append(payload)
                stream = self._streams_by_id.get(sid)
                if stream is not None:
                    stream.commit(records, timestamps, metered, [], arrival)

    def _apply_meta(self, op: dict[str, Any]) -> None:
        kind = op["op"]
        if kind == "create_basin":
            self.basins[op["name"]] = Basin(
                op["name"], op["config"], op["created_at"], op.get("request_token")
            )
        elif kind == "mark_basin_deleted":
            self.basins[op["name"]].deleted_at = op["deleted_at"]
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
            stream.cipher = op.get("cipher")
            self.basins[op["basin"]].streams[op["name"]] = stream
            self._streams_by_id[sid] = stream
            self._next_stream_id = max(self._next_stream_id, sid + 1)
        elif kind == "mark_stream_deleted":
            marked = self._streams_by_id[op["id"]]
            marked.deleted_at = op["deleted_at"]
            marked.notify()
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
        self._write(meta_entry(op))
        self._apply_meta(op)

    def _drop_stream(self, stream: Stream) -> None:
        if stream.deleted_at is None:
            stream.deleted_at = _rfc3339()  # removed with no pending state (older journals)
        self._streams_by_id.pop(stream.id, None)
        stream.notify()

    # -- deletion (see `deletion`)

    def _delete_stream(self, stream: Stream) -> None:
        """Append the terminal trim and mark the stream deleted (one journal write), then
        have it removed after the delay."""
        now = self.clock()
        entries, timestamps, metered, _ = stream.prepare_append([TERMINAL_TRIM], None, None, now)
        mark = {"op": "mark_stream_deleted", "id": stream.id, "deleted_at": _rfc3339()}
        self._write(append_entry(stream.id, now, timestamps, metered, entries) + meta_entry(mark))
        stream.commit(entries, timestamps, metered, [], now)
        self._apply_meta(mark)
        self.removals.later(partial(self._remove_stream, stream))

    def _remove_stream(self, stream: Stream) -> None:
        if self._streams_by_id.get(stream.id) is not stream:
            return
        self._meta({"op": "delete_stream", "id": stream.id})
        basin = self.basins.get(stream.basin)
        if basin is not None and basin.deleted_at is not None:
            self._remove_basin_if_empty(basin)

    def _remove_basin_if_empty(self, basin: Basin) -> None:
        if not basin.streams and self.basins.get(basin.name) is basin:
            self._meta({"op": "delete_basin", "name": basin.name})

    def _resume_deletions(self) -> None:
        """After a replay: remove what was deletion pending (after the delay), and delete
        the streams left live in a basin being deleted."""
        for basin in list(self.basins.values()):
            for stream in list(basin.streams.values()):
                if stream.deleted_at is not None:
                    self.removals.later(partial(self._remove_stream, stream))
                elif basin.deleted_at is not None:
                    self._delete_stream(stream)
            if basin.deleted_at is not None:
                self._remove_basin_if_empty(basin)

    # -- basins

    def basin(self, name: str) -> Basin:
        basin = self.basins.get(name)
        if basin is None:
            raise ApiError.standard(404, "basin_not_found", f"basin `{name}` not found")
        return basin

    def _pending(self, name: str) -> Basin | None:
        """The basin of that name, unless it is being deleted (409)."""
        basin = self.basins.get(name)
        if basin is not None and basin.deleted_at is not None:
            raise basin_deletion_pending(name)
        return basin

    def create_basin(
        self, name: str, config: Any, *, request_token: str | None = None
    ) -> tuple[Basin, bool]:
        """Create a basin; returns (basin, created). Same request token again is a no-op."""
        validate_basin_name(name)
        existing = self._pending(name)
        if existing is not None:
            key = _idempotency_key(request_token, config)
            if key is not None and existing.request_token == key:
                return existing, False
            raise ApiError.standard(
                409, "resource_already_exists", f"basin `{name}` already exists"
            )
        cfg = ensure_basin_config(config)
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
        basin = self._pending(name)
        if basin is None:
            basin, _ = self.create_basin(name, config)
            return basin, "created"
        # As in s2-lite, the desired config replaces the current one (defaults fill gaps).
        new = ensure_basin_config(config)
        if new == basin.config:
            return basin, "noop"
        self._meta({"op": "basin_config", "name": name, "config": new})
        return basin, "updated"

    def reconfigure_basin(self, name: str, update: Any) -> Basin:
        basin = self.basin(name)
        self._pending(name)
        new = apply_basin_config(basin.config, update)
        if new != basin.config:
            self._meta({"op": "basin_config", "name": name, "config": new})
        return basin

    def delete_basin(self, name: str) -> None:
        """Mark the basin deleted and delete its streams (again: nothing changes); it is
        removed once they are (s2-lite `delete_basin`, `bgtasks/basin_deletion.rs`)."""
        basin = self.basin(name)
        if basin.deleted_at is not None:
            return
        self._meta({"op": "mark_basin_deleted", "name": name, "deleted_at": _rfc3339()})
        for stream in list(basin.streams.values()):
            if stream.deleted_at is None:
                self._delete_stream(stream)
        self._remove_basin_if_empty(basin)

    # -- streams

    def stream(self, basin_name: str, name: str, *, auto_create: str | None = None,
               config: Any = None) -> Stream:
        """Look a stream up (409 while its deletion is pending); `auto_create` names the
        basin flag that may create it, with `config` (an `s2-stream-config` header)."""
        basin = self.basin(basin_name)
        stream = basin.streams.get(name)
        if stream is None:
            if auto_create is not None and basin.config.get(auto_create):
                stream, _ = self.create_stream(basin_name, name, config)
                return stream
            raise ApiError.standard(
                404, "stream_not_found", f"stream `{name}` in basin `{basin_name}` not found"
            )
        if stream.deleted_at is not None:
            raise stream_deletion_pending()
        return stream

    def _unpending_stream(self, basin: Basin, name: str) -> Stream | None:
        """The stream of that name in `basin` (a provision's view: 409 while the basin or
        the stream is being deleted, s2-lite `provision_stream`)."""
        if basin.deleted_at is not None:
            raise basin_deletion_pending(basin.name)
        stream = basin.streams.get(name)
        if stream is not None and stream.deleted_at is not None:
            raise stream_deletion_pending()
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
        existing = self._unpending_stream(basin, name)
        key = _idempotency_key(request_token, config)
        if existing is not None:
            if exist_ok or (key is not None and existing.request_token == key):
                return existing, False
            raise ApiError.standard(
                409,
                "resource_already_exists",
                f"stream `{name}` in basin `{basin_name}` already exists",
            )
        cfg = resolve_stream_config(config, basin.config)
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
                "cipher": basin.config.get("stream_cipher"),
            }
        )
        return basin.streams[name], True

    def ensure_stream(self, basin_name: str, name: str, config: Any) -> tuple[Stream, str]:
        validate_stream_name(name)
        basin = self.basin(basin_name)
        stream = self._unpending_stream(basin, name)
        if stream is None:
            stream, _ = self.create_stream(basin_name, name, config)
            return stream, "created"
        # As in s2-lite, the desired config replaces the current one (basin defaults
        # fill gaps); PATCH is the way to change single fields.
        new = resolve_stream_config(config, basin.config)
        if new == stream.config:
            return stream, "noop"
        self._meta({"op": "stream_config", "id": stream.id, "config": new})
        return stream, "updated"

    def reconfigure_stream(self, basin_name: str, name: str, update: Any) -> Stream:
        basin = self.basin(basin_name)
        if basin.deleted_at is not None:
            raise basin_deletion_pending(basin_name)
        stream = self.stream(basin_name, name)
        new = reconfigure_stream_config(stream.config, update, self.basin(basin_name).config)
        if new != stream.config:
            self._meta({"op": "stream_config", "id": stream.id, "config": new})
        return stream

    def delete_stream(self, basin_name: str, name: str) -> None:
        """Delete a stream: deletion pending, removed after the delay (again while it is
        pending: nothing changes)."""
        stream = self.basin(basin_name).streams.get(name)
        if stream is None:
            raise ApiError.standard(
                404, "stream_not_found", f"stream `{name}` in basin `{basin_name}` not found"
            )
        if stream.deleted_at is None:
            self._delete_stream(stream)

    # -- records

    def append(
        self,
        stream: Stream,
        records: list[AppendRecord],
        match_seq_num: int | None,
        fencing_token: str | None,
        sealer: Sealer | None = None,
    ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """Append a validated batch; returns (start, end, tail) positions. An encrypted
        stream's records are sealed with `sealer` (its cipher and the request's key),
        command records excepted, before they are journaled. A session that still holds
        a deleted stream is told its streamer is gone (503)."""
        if stream.deleted_at is not None:
            raise streamer_gone()
        now = self.clock()
        entries, timestamps, metered, commands = stream.prepare_append(
            records, match_seq_num, fencing_token, now
        )
        effects: list[tuple[str, Any]] = []
        for seq, _op in commands:
            kind, value = command_effect(records[seq - stream.next_seq])
            if kind == "trim":
                value = min(value, seq + 1)
            effects.append((kind, value))
        if stream.cipher is not None:
            assert sealer is not None and sealer.cipher == stream.cipher
            entries = sealer.seal_all(entries, {seq - stream.next_seq for seq, _ in commands})
        if self._journal is not None:
            meta = [meta_entry({"op": kind, "id": stream.id,
                                ("token" if kind == "fence" else "point"): value})
                    for kind, value in effects]
            entry = append_entry(stream.id, now, timestamps, metered, entries)
            self._write(entry + b"".join(meta))
        start = (stream.next_seq, timestamps[0])
        stream.commit(entries, timestamps, metered, effects, now)
        end = (stream.next_seq, stream.last_ts)
        return start, end, end


def _idempotency_key(request_token: str | None, config: Any) -> str | None:
    """A create is a no-op retry when both its request token and its config match."""
    if request_token is None:
        return None
    return request_token + "\n" + json.dumps(config, sort_keys=True)
