"""The digest a data mark carries: a running checksum of the rows its partition has in
the stream for the micro-batch, in stream order (no I/O).

A replay that finds k of its partition's rows in the stream skips its own first k rows
only where their digest is the one the mark holds, that is the same rows in the same
order; otherwise it finds what landed by content (`_replay`). The checksum is zlib's
crc32 and adler32 over the rows' encoded `records` entries (as appended, before S2
stamps anything), both of which carry on from a previous value, so the digest of rows
[0, k) does not depend on how they were cut into appends, and it costs about 0.6 ns a
byte (no extra pass over Arrow columns, no per-row Python). The two make 64 bits,
written in base 64 (crc32 first, then adler32's order-dependent half); a mark keeps as
many leading characters as its 36 bytes leave room for, at most `MARK_CHARS`.
"""

from __future__ import annotations

import binascii
import zlib
from dataclasses import dataclass

__all__ = ["DIGEST_CHARS", "MARK_CHARS", "MIN_CHARS", "RowsDigest"]

#: Characters of the digest a mark holds at most (60 bits).
MARK_CHARS = 10
#: Characters a stored digest needs for a replay to trust a match (30 bits); a mark
#: with fewer (its other fields took the room) makes a replay read back instead.
MIN_CHARS = 5
#: The characters of a digest (base 64; no ".", which separates a mark's fields).
DIGEST_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


@dataclass(frozen=True, slots=True)
class RowsDigest:
    """The checksum of a sequence of encoded rows (`extend` adds the next ones)."""

    crc: int = 0
    adler: int = 1

    def extend(self, entries: bytes | memoryview) -> RowsDigest:
        """The digest of the rows so far followed by `entries` (encoded records)."""
        return RowsDigest(zlib.crc32(entries, self.crc), zlib.adler32(entries, self.adler))

    def text(self) -> str:
        """The digest as 11 base-64 characters (a mark keeps a prefix of them)."""
        raw = ((self.crc << 32) | self.adler).to_bytes(8, "big")
        return binascii.b2a_base64(raw, newline=False)[:11].decode("ascii")

    def matches(self, stored: str) -> bool:
        """Whether `stored` (a mark's digest, maybe cut short) is this digest's, long
        enough to be trusted."""
        return len(stored) >= MIN_CHARS and self.text().startswith(stored)
