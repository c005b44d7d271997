"""The digest a data mark carries: a running checksum of the rows its partition has in
the stream for the micro-batch, in stream order (no I/O).

A replay that finds k of its partition's rows in the stream skips its own first k rows
only where their digest is the one the mark holds, that is the same rows in the same
order; otherwise it finds what landed by content (`_replay`). The digest is zlib's crc32
of the rows' encoded `records` entries (as appended, before S2 stamps anything) and
their size in bytes, both carried on from one append to the next, so the digest of rows
[0, k) does not depend on how they were cut into appends. crc32 is the cheapest full
pass over the bytes the standard library has (zlib's runs at about 1 GB/s, as much again
as encoding them; the C accelerator's gives the same values 10x faster where the CPU
multiplies carry-less, `_fastwire.crc32`): rows that differ pass for the same with a
chance of one in four billion. Written in base 64, crc32 first; a
mark keeps as many leading characters as its 36 bytes leave room for, at most
`MARK_CHARS`.
"""

from __future__ import annotations

import binascii
import zlib
from typing import NamedTuple

from s2_spark.wire._accelerator import fastwire

_crc32 = zlib.crc32 if fastwire is None else fastwire.crc32

__all__ = ["DIGEST_CHARS", "MARK_CHARS", "MIN_CHARS", "NO_ROWS", "RowsDigest"]

#: Characters of the digest a mark holds at most (the crc and 28 bits of the size).
MARK_CHARS = 10
#: Characters a stored digest needs for a replay to trust a match (the whole crc); a
#: mark with fewer (its other fields took the room) makes a replay read back instead.
MIN_CHARS = 6
#: The characters of a digest (base 64; no ".", which separates a mark's fields).
DIGEST_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


class RowsDigest(NamedTuple):
    """The checksum of a sequence of encoded rows (`extend` adds the next ones). A tuple:
    one is made per append."""

    crc: int = 0
    size: int = 0

    def extend(self, entries: bytes | memoryview) -> RowsDigest:
        """The digest of the rows so far followed by `entries` (encoded records)."""
        return RowsDigest(_crc32(entries, self.crc), self.size + len(entries))

    def text(self) -> str:
        """The digest as 11 base-64 characters (a mark keeps a prefix of them)."""
        raw = ((self.crc << 32) | (self.size & 0xFFFFFFFF)).to_bytes(8, "big")
        return binascii.b2a_base64(raw, newline=False)[:11].decode("ascii")

    def matches(self, stored: str) -> bool:
        """Whether `stored` (a mark's digest, maybe cut short) is this digest's, long
        enough to be trusted."""
        return len(stored) >= MIN_CHARS and self.text().startswith(stored)


#: The digest of no rows, where every partition's starts.
NO_ROWS = RowsDigest()
