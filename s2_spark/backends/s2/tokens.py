"""What the S2 sink writes into a stream besides data: marks and fencing tokens (no I/O).

S2 has no server-side dedup; the sink builds exactly-once from the stream's fencing token
and `match_seq_num` (`stream_sink` says how). It leaves two kinds of fence record:

* A **mark** ends every data append: a fence record naming the writer (query, micro-batch,
  planning time, partition, attempt), how many of that partition's rows for the stream
  are in the stream with it (`progress`) and the digest of those rows (`_digest`, cut to
  the room the mark leaves). Marks are read back (`_history`) when a writer must learn
  what an earlier attempt or run wrote. ``p`` marks follow data; ``m`` marks are left by
  a writer that set a token of its own without data (a *bump*).
* A **token** follows the mark and sets the stream's fencing token back, or to a new one.
  While one run of a streaming query writes a stream, its token is the run's
  (`WriterId.run_token`): the same for every task and micro-batch of the run, so tasks
  write the same streams at once, every append conditioned on it, none waiting. A writer
  that must be sure nobody else writes its rows (a retried task, an append whose outcome is
  unknown) sets a token only it knows (`WriterId.bump_token`) and reads the marks back.
  A batch job keeps a stream's empty token as it finds it.

`WriterId.sees` classifies a token a writer finds on a stream (`Seen`); the release before
this one left lease tokens (``w...``), which still parse, as marks without a digest, as do
data marks written before digests were added. Every value is at most 36 bytes, S2's
limit; numbers are base 36.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from s2_spark.backends.s2._digest import DIGEST_CHARS, MARK_CHARS, RowsDigest
from s2_spark.errors import S2SparkError
from s2_spark.s2._limits import MAX_TOKEN_BYTES

__all__ = [
    "FENCE_HEADERS",
    "JOB_QUERY",
    "MAX_TOKEN_BYTES",
    "DataMarks",
    "ForeignFenceError",
    "Mark",
    "Seen",
    "WriterId",
    "data_mark",
    "fence_entry",
    "is_token",
    "parse_mark",
    "query_key",
    "run_key",
]

#: The query key of batch jobs (each job is told apart by its run and generation).
JOB_QUERY = "job"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_RUN_CHARS = 8

#: The one header of a fence command record: an empty name, the command as its value.
FENCE_HEADERS = ((b"", b"fence"),)


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


def _digest(text: str, chars: int, nbytes: int) -> str:
    value = int.from_bytes(hashlib.sha256(text.encode()).digest()[:nbytes], "big")
    return _b36(value % 36**chars).rjust(chars, "0")


def query_key(query_id: str) -> str:
    """Three base-36 characters naming a streaming query (stable across restarts, and the
    same as the releases before this one computed them)."""
    return _digest(query_id, 3, 4)


def run_key(run_id: str) -> str:
    """Eight base-36 characters naming one run of a query, or one batch job (41 bits: two
    runs of a query sharing a key is a one-in-two-trillion chance)."""
    return _digest(run_id, _RUN_CHARS, 8)


def _checked(raw: str) -> str:
    if len(raw) > MAX_TOKEN_BYTES:
        raise S2SparkError(
            f"fence record {raw!r} exceeds S2's {MAX_TOKEN_BYTES}-byte fencing token limit "
            "(batch id, partition, attempt or row count too large)"
        )
    return raw


@dataclass(frozen=True, slots=True)
class Mark:
    """A writer's mark, read back from a stream: `data` for a ``p`` mark (it followed
    data; the release before this one left only such), False for a bump's ``m`` mark.
    `digest`: the data mark's digest of its partition's rows (`_digest`), maybe cut
    short, even to ""; None for a bump's mark and for marks written before digests."""

    streaming: bool
    query: str
    generation: int
    batch: int
    partition: int
    attempt: int
    progress: int
    data: bool
    digest: str | None = None

    def encode(self) -> str:
        mode = "s" if self.streaming else "b"
        fields = (f"{'p' if self.data else 'm'}{mode}{self.query}.{_b36(self.generation)}."
                  f"{_b36(self.batch)}.{_b36(self.partition)}.{_b36(self.attempt)}."
                  f"{_b36(self.progress)}")
        return _checked(fields if self.digest is None else f"{fields}.{self.digest}")


def _numbers(parts: list[str]) -> list[int] | None:
    try:
        return [int(p, 36) for p in parts]
    except ValueError:
        return None


def parse_mark(raw: str) -> Mark | None:
    """The mark a fence record holds (the previous release's lease tokens included), or
    None for anything else: a token, or a fence record s2-spark did not write."""
    if len(raw) < 7:
        return None
    if raw[0] in "pm" and raw[1] in "sb":
        head, _, rest = raw.partition(".")
        fields = rest.split(".")
        digest = None
        if len(fields) == 6 and raw[0] == "p":
            digest = fields.pop()
            if not DIGEST_CHARS.issuperset(digest):
                return None
        numbers = _numbers(fields)
        if len(head) != 5 or numbers is None or len(numbers) != 5:
            return None
        gen, batch, part, attempt, progress = numbers
        return Mark(raw[1] == "s", head[2:], gen, batch, part, attempt, progress,
                    data=raw[0] == "p", digest=digest)
    if raw[0] == "w" and raw[1] in "LR" and raw[2] in "sSbB":
        # The previous release's lease: w<held><mode, upper when clean><query>.<gen>.<batch>
        # .<partition>.<attempt>.<progress>, set by every append with its progress.
        head, _, rest = raw.partition(".")
        numbers = _numbers(rest.split("."))
        if len(head) != 6 or numbers is None or len(numbers) != 5:
            return None
        gen, batch, part, attempt, progress = numbers
        return Mark(raw[2] in "sS", head[3:], gen, batch, part, attempt, progress, data=True)
    return None


class Seen(enum.Enum):
    """What a token found on a stream means to a writer (`WriterId.sees`)."""

    #: The writer's run's own token, or one a bump of an earlier micro-batch of the run
    #: set: a first attempt appends under it at once.
    OURS = "ours"
    #: A token a bump of this micro-batch set: read the marks before appending.
    OURS_BUMPED = "ours_bumped"
    #: A token a bump of a later micro-batch of the run set: this writer is stale.
    NEWER = "newer"
    #: Another run of the writer's query (or its previous release): read the marks, then
    #: take the stream over, unless a newer run has it.
    EARLIER_RUN = "earlier_run"
    #: No token, on a streaming query's stream: a new stream (or one whose token was
    #: cleared); take it over at its tail.
    EMPTY = "empty"
    #: Another query or job: take the stream over (a stream has one writer at a time).
    OTHER_WRITER = "other_writer"
    #: Not an s2-spark token.
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True)
class WriterId:
    """One attempt at writing one partition of one micro-batch (or batch job).

    `query`: `query_key` of the streaming query (`JOB_QUERY` for batch jobs); `run`:
    `run_key` of the query's run (a new one at every start) or of the batch job.
    `generation`: milliseconds when the micro-batch (job) was planned, so a restarted
    query's replay of batch N outranks the killed run's attempts.
    """

    query: str
    streaming: bool
    run: str
    generation: int
    batch: int
    partition: int
    attempt: int

    @property
    def _prefix(self) -> str:
        return f"{'s' if self.streaming else 'b'}{self.query}{self.run}"

    def run_token(self) -> str:
        """The token every writer of this run appends under (a job: under "" too)."""
        return f"r{self._prefix}"

    def bump_token(self, k: int) -> str:
        """A token only this writer sets: its `k`-th bump on a stream."""
        return _checked(f"n{self._prefix}.{_b36(self.batch)}.{_b36(self.partition)}."
                        f"{_b36(self.attempt)}.{_b36(k)}")

    def mark(self, progress: int, *, data: bool = True, digest: RowsDigest | None = None
             ) -> Mark:
        """This writer's mark; a data mark with the `digest` of its partition's rows in
        the stream as `DataMarks` writes it (a bump's mark holds no digest)."""
        if digest is not None and data:
            mark = parse_mark(DataMarks(self).encode(progress, digest))
            assert mark is not None
            return mark
        return Mark(self.streaming, self.query, self.generation, self.batch, self.partition,
                    self.attempt, progress, data)

    def same_writer_kind(self, m: Mark) -> bool:
        """Whether `m` was left by this query (a streaming writer) or this job."""
        return (m.streaming == self.streaming and m.query == self.query
                and (self.streaming or m.generation == self.generation))

    def sees(self, token: str) -> Seen:
        """What `token`, found on a stream, means to this writer."""
        if token == self.run_token() or (token == "" and not self.streaming):
            return Seen.OURS
        if token == "":
            return Seen.EMPTY
        if token.startswith(f"n{self._prefix}."):
            batch = _numbers(token.split(".")[1:2])
            if not batch or batch[0] == self.batch:
                return Seen.OURS_BUMPED
            return Seen.OURS if batch[0] < self.batch else Seen.NEWER
        this_query = f"s{self.query}" if self.streaming else None
        if is_token(token):
            return Seen.EARLIER_RUN if token[1:5] == this_query else Seen.OTHER_WRITER
        old = parse_mark(token) if token[:1] == "w" else None
        if old is None:
            return Seen.FOREIGN
        if old.streaming and f"s{old.query}" == this_query:
            return Seen.EARLIER_RUN
        return Seen.OTHER_WRITER


class DataMarks:
    """One writer's data marks, encoded: the mark of every append, so built from a head
    made once. A mark keeps as much of its digest as fits in S2's 36 bytes, at most
    `MARK_CHARS` characters, maybe none (then a replay reads its rows back)."""

    __slots__ = ("head",)

    def __init__(self, me: WriterId) -> None:
        #: Every mark's first characters (all but the progress and digest): what the
        #: writer's first appends to many streams are built from in one pass.
        self.head = Mark(me.streaming, me.query, me.generation, me.batch, me.partition,
                         me.attempt, 0, data=True).encode()[:-1]  # all but progress 0

    def encode(self, progress: int, digest: RowsDigest) -> str:
        return data_mark(self.head, progress, digest)

    def fits(self, progress: int) -> bool:
        """Whether a mark of `progress` rows fits a fencing token (`encode` raises where
        not)."""
        return len(self.head) + len(_b36(progress)) + 1 <= MAX_TOKEN_BYTES


def data_mark(head: str, progress: int, digest: RowsDigest) -> str:
    """A data mark from its `head` (`DataMarks.head`), with as much of the digest as fits."""
    fields = head + _b36(progress)
    room = MAX_TOKEN_BYTES - len(fields) - 1
    return _checked(f"{fields}.{digest.text()[:max(0, min(room, MARK_CHARS))]}")


def is_token(raw: str) -> bool:
    """Whether fence value `raw` is a token s2-spark sets (a run's or a bump's; a
    job's empty one), not a mark."""
    return raw == "" or (raw[:1] in ("r", "n") and raw[1:2] in ("s", "b")
                         and len(raw) >= 5 + _RUN_CHARS)


def fence_entry(value: str) -> tuple[bytes, int]:
    """The encoded `records` entry of a fence command record holding `value` (a mark or
    a token), and its metered size: `encode_record(value, FENCE_HEADERS, 0)`, built
    directly (every append carries two; a token's is made once). Timestamp 0: S2 keeps
    timestamps monotonic, so the fence takes the previous record's time instead of moving
    the stream's clock."""
    entry = _TOKEN_ENTRIES.get(value)
    if entry is None:
        body = value.encode()
        inner = _FENCE_PREFIX + (b"\x1a" + bytes((len(body),)) + body if body else b"")
        entry = b"\x0a" + bytes((len(inner),)) + inner, _FENCE_METERED + len(body)
        if is_token(value):
            if len(_TOKEN_ENTRIES) >= 4096:
                _TOKEN_ENTRIES.clear()
            _TOKEN_ENTRIES[value] = entry
    return entry


#: A fence record's fields before its body: timestamp 0, the header (empty name, omitted).
_FENCE_PREFIX = b"\x08\x00\x12\x07\x12\x05fence"
_FENCE_METERED = 8 + 2 + len("fence")
_TOKEN_ENTRIES: dict[str, tuple[bytes, int]] = {}
