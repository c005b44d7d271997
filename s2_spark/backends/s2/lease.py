"""The lease protocol of the S2 sink: who may write a stream, and how far they got.

S2 has no server-side dedup; the sink builds exactly-once from the stream's fencing
token (see `stream_sink`). The token is a lease, `LeaseToken`: who holds the stream
(query, generation, batch, partition, attempt), whether it is held or released, and how
many of that partition's rows for this stream are in the stream already (`progress`).
Every data append ends with a fence record setting the next token, so data and progress
land together.

This module is the protocol without I/O where it can be: the tokens, `decide` (what a
writer does on finding a token: take the stream, wait, or stop as stale; a pure function,
testable without a server), and reading fence records back (`FenceRecords`) to learn a
partition's progress after a restart or a stolen lease.

The lease token is at most 36 bytes: ``w<state><mode><query>.<gen>.<batch>.<part>.<attempt>
.<progress>`` with numbers in base 36. Fence records stay in the stream (readers skip
command records by default).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from s2_spark.errors import S2SparkError, WriterFencedError
from s2_spark.wire.appends import encode_record

if TYPE_CHECKING:
    from s2_spark.s2 import StreamClient

__all__ = [
    "MAX_TOKEN_BYTES",
    "Decision",
    "FenceRecords",
    "ForeignFenceError",
    "LeaseToken",
    "WriterId",
    "decide",
    "fence_entry",
    "query_key",
]

MAX_TOKEN_BYTES = 36
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


class ForeignFenceError(S2SparkError):
    """The target stream is fenced with a token that s2-spark did not set."""


def _b36(n: int) -> str:
    if n < 0:
        raise ValueError(f"cannot encode negative number {n}")
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _DIGITS[r] + out
        if n == 0:
            return out


def query_key(query_id: str) -> str:
    """Three base-36 characters naming a streaming query (stable across restarts)."""
    digest = int.from_bytes(hashlib.sha256(query_id.encode()).digest()[:4], "big")
    return _b36(digest % 36**3).rjust(3, "0")


@dataclass(frozen=True, slots=True)
class WriterId:
    """One attempt at writing one partition of one logical batch.

    `streaming`: a micro-batch of query `query` (batch ids repeat across restarts);
    otherwise a batch job (each job is its own logical batch, told apart by
    `generation`). `generation`: milliseconds when the batch was planned, so a restarted
    query's replay of batch N outranks the killed run's attempts.
    """

    query: str
    streaming: bool
    generation: int
    batch: int
    partition: int
    attempt: int

    def lease(self, *, held: bool, clean: bool, progress: int) -> LeaseToken:
        return LeaseToken(held, clean, self.streaming, self.query, self.generation,
                          self.batch, self.partition, self.attempt, progress)

    def same_batch(self, t: LeaseToken) -> bool:
        """Whether `t` was set by a writer of this logical batch."""
        return (t.query == self.query and t.streaming == self.streaming
                and (t.batch == self.batch if self.streaming
                     else t.generation == self.generation))


@dataclass(frozen=True, slots=True)
class LeaseToken:
    """A fencing token set by this sink. `clean`: every record of this logical batch in
    the stream was written by the first attempt of its partition, in this generation,
    without a stolen lease, so such an attempt can trust what it remembers."""

    held: bool
    clean: bool
    streaming: bool
    query: str
    generation: int
    batch: int
    partition: int
    attempt: int
    progress: int

    def encode(self) -> str:
        mode = "s" if self.streaming else "b"
        raw = (
            f"w{'L' if self.held else 'R'}{mode.upper() if self.clean else mode}{self.query}."
            f"{_b36(self.generation)}.{_b36(self.batch)}.{_b36(self.partition)}."
            f"{_b36(self.attempt)}.{_b36(self.progress)}"
        )
        if len(raw) > MAX_TOKEN_BYTES:
            raise S2SparkError(
                f"lease token {raw!r} exceeds S2's {MAX_TOKEN_BYTES}-byte fencing token limit "
                "(batch id, partition, attempt or row count too large)"
            )
        return raw

    @classmethod
    def parse(cls, raw: str) -> LeaseToken | None:
        """The token, or None when s2-spark did not write it."""
        if len(raw) < 7 or raw[0] != "w" or raw[1] not in "LR" or raw[2] not in "sSbB":
            return None
        head, _, rest = raw.partition(".")
        query = head[3:]
        parts = rest.split(".")
        if len(query) != 3 or len(parts) != 5:
            return None
        try:
            gen, batch, part, attempt, progress = (int(p, 36) for p in parts)
        except ValueError:
            return None
        return cls(raw[1] == "L", raw[2].isupper(), raw[2] in "sS", query, gen, batch, part,
                   attempt, progress)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a writer does on finding a token: `take` the stream (resuming after
    `progress` rows, or after what a `scan` of the batch's fence records finds), `wait`
    for its holder, or stop as `stale` (`reason`)."""

    kind: Literal["take", "wait", "stale"]
    progress: int = 0
    clean: bool = False
    scan: bool = False
    reason: str = ""


def decide(me: WriterId, raw: str, *, stolen: bool, known: int, what: str) -> Decision:
    """What `me` does on finding token `raw` on the stream (`what` names it in errors).
    `stolen`: the holder went `lease_timeout` without progress; `known`: the rows of
    this partition `me` knows to be in the stream."""
    first = me.attempt == 0
    if raw == "":
        return Decision("take", progress=0, clean=first)
    t = LeaseToken.parse(raw)
    if t is None:
        raise ForeignFenceError(
            f"{what} is fenced with a token s2-spark did not set; another writer owns it. "
            "Write to another stream, or clear the token (a fence command with an empty "
            "token) if that writer is gone"
        )
    same_query = t.query == me.query and t.streaming == me.streaming
    if me.streaming and same_query:
        if t.batch < me.batch:
            return Decision("take", progress=0, clean=first)
        if t.batch > me.batch:
            return Decision("stale", reason=f"micro-batch {t.batch} already wrote it")
    if not same_query or (not me.streaming and t.generation != me.generation):
        # Another query or batch job: free once released (or abandoned).
        if t.held and not stolen:
            return Decision("wait")
        return Decision("take", progress=0, clean=first)
    # The same logical batch.
    if t.generation > me.generation:
        return Decision("stale", reason="a newer run of this batch writes it")
    if t.generation < me.generation:
        return Decision("take", scan=True)
    if t.partition == me.partition:
        if t.attempt > me.attempt:
            return Decision("stale", reason=f"attempt {t.attempt} of this task writes it")
        return Decision("take", progress=t.progress, clean=t.clean and t.attempt == me.attempt)
    if t.held and not stolen:
        return Decision("wait")
    if t.clean and first and not stolen:
        return Decision("take", progress=known, clean=True)
    return Decision("take", scan=True)


def fence_entry(token: str) -> tuple[bytes, int]:
    """The encoded `records` entry of a fence command record setting `token`, and its
    metered size. Timestamp 0: S2 keeps timestamps monotonic, so the fence takes the
    previous record's time instead of moving the stream's clock. Encoded directly (a
    one-record Arrow encode costs 20x more, a batch's set-up 10x)."""
    return encode_record(token.encode(), FENCE_HEADERS, 0)


#: The one header of a fence command record: an empty name, the command as its value.
FENCE_HEADERS = ((b"", b"fence"),)


class FenceRecords:
    """A stream's fence records read back from its tail, newest first."""

    def __init__(self, stream: StreamClient, what: str) -> None:
        self._stream = stream
        self._what = what

    def tokens(self) -> Iterator[str]:
        """The stream's fence tokens, newest first: read a window at a time (doubling)
        backwards from the tail."""
        hi = self._stream.check_tail().seq_num
        window = 1000
        while hi > 0:
            lo = max(0, hi - window)
            yield from reversed(self._between(lo, hi))
            hi = lo
            window = min(window * 2, 64000)

    def progress_of(self, me: WriterId) -> int:
        """`me`'s partition's progress, from the fence records of its logical batch, read
        back until one of an earlier batch (or another writer) marks where the batch
        began. A newer attempt of the partition means `me` is stale."""
        progress = 0
        for raw in self.tokens():
            t = LeaseToken.parse(raw)
            if t is None or not me.same_batch(t):
                return progress
            if t.partition != me.partition:
                continue
            if t.generation > me.generation or (
                    t.generation == me.generation and t.attempt > me.attempt):
                raise WriterFencedError(
                    f"{self._what}: a newer attempt of partition {me.partition} of batch "
                    f"{me.batch} already wrote it; this attempt is stale and stops",
                    stream=self._stream.name,
                )
            progress = max(progress, t.progress)
        return progress

    def landed_before(self, chain: list[str], known: str) -> bool:
        """Whether the last of `chain` (tokens of appends sent after token `known`) is in
        the stream: the newest of them, or of `known`, read back from the tail."""
        for raw in self.tokens():
            if raw in chain:
                return raw == chain[-1]
            if raw == known:
                return False
        return False

    def _between(self, lo: int, hi: int) -> list[str]:
        """Bodies of the fence records in [lo, hi), in order."""
        tokens: list[str] = []
        pos = lo
        while pos < hi:
            decoded = self._stream.read(seq_num=pos, count=min(1000, hi - pos),
                                        include_command_records=True)
            if decoded.count == 0:
                break
            batch = decoded.batch
            seqs = batch.column("seq_num").to_pylist()
            headers = batch.column("headers").to_pylist()
            bodies = batch.column("body").to_pylist()
            for s, h, b in zip(seqs, headers, bodies, strict=True):
                if s >= hi:
                    break
                if h and len(h) == 1 and h[0]["name"] == b"" and h[0]["value"] == b"fence":
                    tokens.append(b.decode("utf-8", "replace"))
            pos = int(seqs[-1]) + 1
        return tokens
