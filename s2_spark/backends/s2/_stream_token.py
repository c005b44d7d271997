"""The token half of `StreamSink`: what its next append is conditioned on and sets,
learnt from the service's refusals and from the stream's marks, and the bumps that make
a token only this writer knows. A mixin; `StreamSink` holds the state it shares.

The rules (`tokens` has the vocabulary, docs/writing.md the reasons):

* A first attempt appends under its run's token (or, where this process saw the stream
  last, the token it saw), and the first micro-batch of a query under the empty token of
  a new stream, setting its run's. When that is refused, the refusal names the stream's
  token and `_learn` decides from it alone what to condition on next, and what must be
  read first: nothing (the run's token), the marks since the writer last looked (a bump
  of this micro-batch), or the marks back to where the micro-batch began (an earlier run:
  then the next append is a takeover, also conditioned on the tail read, so nothing can
  land between the read and the takeover).
* A retried or speculative attempt, and a writer whose append's outcome is unknown,
  first bumps: one append holding its mark and a token only it knows, conditioned on the
  stream's current token. Anything appended after the bump is its own, so the marks read
  up to the bump say exactly how far its partition got, and any other attempt of its task
  is refused from then on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

from s2_spark.backends.s2._deletion import being_deleted
from s2_spark.backends.s2._history import History, Landed, StreamMarks
from s2_spark.backends.s2.tokens import ForeignFenceError, Seen, WriterId, fence_entry
from s2_spark.errors import (
    AlreadyExistsError,
    DeletionPendingError,
    FencingTokenMismatchError,
    NotFoundError,
    S2NotFoundError,
    S2SparkError,
    WriterFencedError,
)
from s2_spark.wire.appends import AppendBatch

if TYPE_CHECKING:
    from s2_spark.backends.s2.settings import AppendBudget, SinkSettings
    from s2_spark.s2 import AppendAck, BasinClient, StreamClient

__all__ = ["StreamToken", "first_tokens", "guessed_token", "remember_all", "seen_tokens"]

#: Tokens this process last saw per stream, the next writer's guess (bounded).
_SEEN_TOKENS: dict[tuple[str, str, str], str] = {}
_SEEN_MAX = 100_000
#: Takeovers refused because the stream moved between the read and the append, before
#: the writer bumps instead (an earlier run's writer still appending).
_TAKEOVER_TRIES = 3

Check = Literal["back", "forward", "takeover"]


def guessed_token(key: tuple[str, str, str]) -> str | None:
    """The token this process last saw on stream `key` (endpoint, basin, stream)."""
    return _SEEN_TOKENS.get(key)


def seen_tokens(keys: Iterable[tuple[str, str, str]]) -> list[str | None]:
    """`guessed_token` of each stream `keys` names."""
    get = _SEEN_TOKENS.get
    return [get(key) for key in keys]


def remember_all(keys: Sequence[tuple[str, str, str]], token: str) -> None:
    """Later writers of this process guess that each stream of `keys` has `token`."""
    if len(_SEEN_TOKENS) + len(keys) > _SEEN_MAX:
        _SEEN_TOKENS.clear()
    _SEEN_TOKENS.update(dict.fromkeys(keys[:_SEEN_MAX], token))


def first_tokens(writer: WriterId, seen: str | None) -> tuple[str, str] | None:
    """What a new `StreamSink` of `writer` conditions its first append on and sets when
    this process last saw token `seen` on its stream (None: never), decided as the sink
    decides (`StreamToken._start_from`); None when that append cannot go out at once (a
    bump or a read comes first). Many streams' first appends are built from this, once
    per token seen."""
    probe = _Probe(writer)
    probe._start_from(seen)
    if not probe.ready or probe._match is not None:
        return None
    return probe._condition, probe._sets


class _Cancelled(S2SparkError):
    """Another stream of the same writer failed first; this one stops (never reported)."""


class StreamToken:
    """The token state of a `StreamSink`: `_condition` (and `_match`, a takeover's tail)
    the next append is conditioned on, `_sets` the token its appends set, `_check` what
    must be read first, `_must_bump` whether a bump comes first, `_progress` the rows of
    the writer's partition known to be in the stream (`_own_progress`: of those, the ones
    this very writer appended; `_ahead`: the appends of them found past the writer's
    buffered rows, not yet checked), `_read_to` how far the writer has seen the stream
    (None: not at all)."""

    name: str
    writer: WriterId
    settings: SinkSettings
    _basin: BasinClient
    _what: str
    _key: tuple[str, str, str]
    _budget: AppendBudget
    _cancel: threading.Event | None
    _progress: int
    _own_progress: int
    _ahead: tuple[Landed, ...]

    @property
    def _stream(self) -> StreamClient:
        raise NotImplementedError

    def _init_token(self) -> None:
        """The first guess: what this process saw on the stream last, else the run's
        token (in a query's first micro-batch: the empty token of a new stream)."""
        self._start_from(guessed_token(self._key))

    def _start_from(self, guess: str | None) -> None:
        """`_init_token` from `guess`, the token this process last saw on the stream."""
        me = self.writer
        self._match: int | None = None
        self._check: Check | None = None
        self._bumps = 0  # bumps this sink made (each token unique)
        self._read_to: int | None = None
        self._refused_takeovers = 0
        self._must_bump = me.attempt > 0
        if guess is None or me.sees(guess) not in (Seen.OURS, Seen.OURS_BUMPED):
            guess = "" if me.streaming and me.batch == 0 else me.run_token()
        self._decide(guess)

    @property
    def _marks(self) -> StreamMarks:
        return StreamMarks(self._stream, self.writer)

    @property
    def ready(self) -> bool:
        """Whether the next append can go out without reading or bumping first."""
        return not self._must_bump and self._check is None

    @property
    def takes_over(self) -> bool:
        """Whether the next append is a takeover that only waits for the marks read back
        from the tail (nothing to bump first): `take_over` can be given them."""
        return not self._must_bump and self._check == "takeover"

    @property
    def match_seq_num(self) -> int | None:
        """The tail the next append is conditioned on (a takeover's), if any."""
        return self._match

    def _remember(self, token: str) -> None:
        """Later writers of this process guess that the stream's token is `token`."""
        if len(_SEEN_TOKENS) >= _SEEN_MAX:
            _SEEN_TOKENS.clear()
        _SEEN_TOKENS[self._key] = token

    def _check_cancel(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise _Cancelled(f"{self._what}: stopped, another stream of this task failed")

    def _stale(self, reason: str) -> WriterFencedError:
        w = self.writer
        return WriterFencedError(
            f"{self._what}: this attempt (partition {w.partition}, attempt {w.attempt}, "
            f"batch {w.batch}) is stale ({reason}) and stops without writing more",
            stream=self.name,
        )

    # -- deciding from a token ------------------------------------------------------------

    def _learn(self, token: str) -> None:
        """The stream's token is `token` (a refusal named it): decide from it."""
        self._remember(token)
        self._decide(token)

    def _decide(self, token: str) -> None:
        """What the next append is conditioned on (`token`) and sets, and what must be
        read first. No I/O."""
        seen = self._meaning(token)
        self._condition, self._match = token, None
        if seen is Seen.OURS:
            self._sets = token
        elif seen is Seen.OURS_BUMPED:
            self._sets = token
            self._check = "forward" if self._read_to is not None else "back"
        elif seen is Seen.EARLIER_RUN:
            self._check = "takeover"
        else:  # another writer's, or none: take the stream over at once
            self._sets = self._new_token(clean=True)

    def _meaning(self, token: str) -> Seen:
        """`WriterId.sees`, raising for the tokens this writer must not write under. A
        writer that bumped never trusts its run's token again without reading."""
        seen = self.writer.sees(token)
        if seen is Seen.FOREIGN:
            raise ForeignFenceError(
                f"{self._what} is fenced with a token s2-spark did not set; another writer "
                "owns it. Write to another stream, or clear the token (a fence command with "
                "an empty token) if that writer is gone"
            )
        if seen is Seen.NEWER:
            raise self._stale("a newer micro-batch of this query wrote it")
        if seen is Seen.OURS and self._bumps:
            return Seen.OURS_BUMPED
        return seen

    def _new_token(self, *, clean: bool) -> str:
        """The token a takeover sets: the run's, for a first attempt that never bumped
        and found no earlier run's rows of its micro-batch (`clean`); else a new token
        only this writer knows (another attempt of its task may still be waiting to
        append under the run's, or other writers of the run must read marks first)."""
        if clean and self.writer.attempt == 0 and not self._bumps:
            return self.writer.run_token()
        return self._fresh_bump_token()

    def _fresh_bump_token(self) -> str:
        self._bumps += 1
        return self.writer.bump_token(self._bumps)

    # -- reading and bumping ----------------------------------------------------------------

    def _prepare(self) -> None:
        """Bump and read marks as `_learn` decided, so the next append may go out."""
        if self._must_bump:
            self._bump()
        check, self._check = self._check, None
        if check == "takeover":
            self._took_over(self._marks.back())
        elif check == "forward":
            assert self._read_to is not None
            self._apply(self._marks.forward(self._read_to, before=self._progress))
        elif check == "back":
            self._apply(self._marks.back())

    def take_over(self, end: int, first: list[tuple[int, str]]) -> None:
        """`_prepare` of a sink that `takes_over`, from the stream's tail `end` and the
        fence records of the first window back from it (`first_window`), read already
        with other streams' (`PartitionWriter` reads its takeovers in bulk)."""
        assert self.takes_over
        self._check = None
        self._took_over(self._marks.back(end, first=first))

    def _took_over(self, history: History) -> None:
        """The takeover goes on from `history`: conditioned on its end (the tail read),
        setting the run's token if no earlier run left rows of this micro-batch."""
        history = self._apply(history)
        self._match = history.end
        self._sets = self._new_token(clean=history.clean)

    def _apply(self, history: History) -> History:
        """Take what the marks say: stop if stale, else note the partition's appends
        found past what the writer knew, to be skipped once its rows are checked against
        them (`StreamSink._settle`)."""
        if history.stale is not None:
            raise self._stale(history.stale)
        fresh = tuple(a for a in history.landed if a.progress > self._progress)
        self._ahead += fresh
        known = fresh[-1].progress if fresh else self._progress
        if history.progress > known:  # rows no data mark accounts for: trusted by count
            self._ahead += (Landed(-1, -1, history.progress, None),)
        self._progress = max(self._progress, history.progress)
        self._own_progress = max(self._own_progress, history.own)
        self._read_to = history.end
        return history

    def _bump(self) -> None:
        """Set a token only this writer knows (its mark before it), conditioned on the
        stream's current one, then read the marks up to it: the rows of this partition
        in the stream, and whether a newer attempt has it. Over an earlier run's token
        the marks are read first, so a stale writer never fences out a newer run."""
        token = self._fresh_bump_token()
        self._match = None
        while True:
            self._check_cancel()
            if self._check == "takeover":
                self._check = None
                self._apply(self._marks.back())
            try:
                ack = self._fences((self.writer.mark(self._progress, data=False).encode(),
                                    token))
                end: int | None = ack.end.seq_num
                break
            except FencingTokenMismatchError as exc:
                if exc.expected_token == token:
                    end = None  # an earlier try landed: nothing can follow it
                    break
                self._learn(exc.expected_token)
                self._match = None
            except NotFoundError as exc:
                self._create_missing(exc)
        self._remember(token)
        self._condition = self._sets = token
        self._check, self._must_bump = None, False
        if self._read_to is None:
            self._apply(self._marks.back(end))
        else:
            self._apply(self._marks.forward(self._read_to, end, before=self._progress))

    def _fences(self, values: tuple[str, ...]) -> AppendAck:
        """One append of fence records only, under the current condition (repeated when
        its outcome is unknown: a repeat that finds its own token set is told by the
        mismatch naming it)."""
        entries = [fence_entry(v) for v in values]
        payload = b"".join(e for e, _ in entries)
        metered = sum(m for _, m in entries)
        with self._budget.hold(1):
            return self._stream.append_payload(
                AppendBatch(payload, len(entries), metered, 0),
                fencing_token=self._condition, match_seq_num=self._match, idempotent=True)

    def _takeover_refused(self) -> None:
        """A takeover met records appended since the read: read again, or after a few
        tries bump (an earlier run's writer is still appending)."""
        self._refused_takeovers += 1
        if self._refused_takeovers >= _TAKEOVER_TRIES:
            self._must_bump = True
        self._check = "takeover"
        self._match = None

    # -- missing streams ----------------------------------------------------------------------

    def _create_missing(self, err: NotFoundError) -> None:
        """The stream does not exist (`err` says so): create it (createStreams), or say
        so; one being deleted cannot be written either way. A new stream has the empty
        token."""
        if err.deletion_pending:
            raise being_deleted(self._what, err, self.settings.create_streams) from err
        if not self.settings.create_streams:
            raise S2NotFoundError(
                f"{self._what} does not exist: create it first, or set the writer "
                "option createStreams=true", status=404, code="stream_not_found",
            ) from None
        try:
            self._basin.create_stream(self.name)
        except AlreadyExistsError:
            pass
        except DeletionPendingError as exc:  # its basin is being deleted
            raise being_deleted(self._what, exc, True) from exc
        self.created()

    def created(self) -> None:
        """The stream was missing and has been created (by this writer or another)."""
        self._learn("")


class _Probe(StreamToken):
    """The token state of a new sink, alone (`first_tokens`): no stream, no I/O."""

    def __init__(self, writer: WriterId) -> None:
        self.writer = writer
        self._what = "a new stream"
        self._cancel = None
