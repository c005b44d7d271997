"""The store's journal: one append-only file of changes, replayed when the server starts.

Each entry is a kind byte, the payload's length, the payload and its CRC-32, so a tail
torn by a crash is recognised and cut off on replay. A metadata entry (`M`) is one JSON
operation (create a basin, fence a stream, ...); an append entry (`A`) holds a stream
id, the records' arrival time and each record's timestamp, metered size and stored
bytes. The store writes each change with a single `os.write` before acknowledging it.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

__all__ = ["KIND_APPEND", "KIND_META", "Journal", "append_entry", "decode_append", "meta_entry"]

_ENTRY_HEAD = struct.Struct("<BI")  # kind, payload length; then payload, then crc32
KIND_META = ord("M")
KIND_APPEND = ord("A")
_APPEND_HEAD = struct.Struct("<IIQ")  # stream id, record count, arrival time (ms)
_APPEND_REC = struct.Struct("<QII")  # timestamp, metered size, entry length


def _journal_entry(kind: int, payload: bytes) -> bytes:
    return _ENTRY_HEAD.pack(kind, len(payload)) + payload + struct.pack("<I", zlib.crc32(payload))


def meta_entry(op: dict[str, Any]) -> bytes:
    """The journal entry of one metadata operation."""
    return _journal_entry(KIND_META, json.dumps(op, separators=(",", ":")).encode())


def append_entry(
    stream_id: int,
    arrival: int,
    timestamps: list[int],
    metered: list[int],
    entries: list[bytes],
) -> bytes:
    """The journal entry of one appended batch (its records as stored)."""
    parts = [_APPEND_HEAD.pack(stream_id, len(entries), arrival)]
    parts.extend(
        _APPEND_REC.pack(t, m, len(e)) for t, m, e in zip(timestamps, metered, entries, strict=True)
    )
    parts.extend(entries)
    return _journal_entry(KIND_APPEND, b"".join(parts))


def decode_append(payload: bytes) -> tuple[int, int, list[bytes], list[int], list[int]]:
    """An append entry's payload as (stream id, arrival, entries, timestamps, metered)."""
    sid, count, arrival = _APPEND_HEAD.unpack_from(payload, 0)
    pos = _APPEND_HEAD.size
    heads = []
    for _ in range(count):
        heads.append(_APPEND_REC.unpack_from(payload, pos))
        pos += _APPEND_REC.size
    entries: list[bytes] = []
    for _, _, length in heads:
        entries.append(payload[pos : pos + length])
        pos += length
    return sid, arrival, entries, [h[0] for h in heads], [h[1] for h in heads]


class Journal:
    """One append-only file of changes; replayed on start, a torn tail is cut off."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "journal.bin"
        self._fd = -1

    def replay(self) -> list[tuple[int, bytes]]:
        """The intact entries as (kind, payload); a torn or corrupt tail is truncated."""
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
