"""One stream's lease, taken, probed and released: the I/O half of the lease protocol
(`lease` decides and reads fence records; this talks to the stream). A mixin of
`StreamSink`, whose state it shares."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from s2_spark.backends.s2.lease import FenceRecords, LeaseToken, WriterId, decide, fence_entry
from s2_spark.backends.s2.settings import AppendBudget, SinkSettings
from s2_spark.errors import (
    AlreadyExistsError,
    FencingTokenMismatchError,
    NotFoundError,
    S2NotFoundError,
    S2SparkError,
    WriterFencedError,
)
from s2_spark.wire.appends import AppendBatch

if TYPE_CHECKING:
    from s2_spark.s2 import AppendAck, BasinClient, StreamClient

__all__ = ["StreamLease", "guessed_token"]

_PROBE = "w-probe"
#: Tokens this process last saw per stream, the next writer's guess (bounded).
_SEEN_TOKENS: dict[tuple[str, str, str], str] = {}
_SEEN_MAX = 100_000


def guessed_token(key: tuple[str, str, str]) -> str:
    """The token this process last saw on stream `key` (endpoint, basin, stream), or ""."""
    return _SEEN_TOKENS.get(key, "")


class _Cancelled(S2SparkError):
    """Another stream of the same writer failed first; this one stops (never reported)."""


class _TakeRefused(Exception):
    """The append that was to take the lease found another token: nothing landed."""


class StreamLease:
    """The lease half of `StreamSink`: what it holds (`_lease`, `_taking`), what the
    stream's token is as far as it knows (`_last_token`, a guess while `_guessed`)."""

    name: str
    writer: WriterId
    settings: SinkSettings
    last_append: float
    _basin: BasinClient
    _stream: StreamClient
    _what: str
    _key: tuple[str, str, str]
    _budget: AppendBudget
    _cancel: threading.Event | None
    _on_wait: Callable[[Any], None] | None
    _lease: LeaseToken | None
    _taking: bool
    _last_token: str
    _guessed: bool
    _tail: int | None
    _progress: int
    _known: bool

    def _saw(self, token: str) -> None:
        """The stream's token is `token` now, as far as this sink knows."""
        self._last_token = token
        self._guessed = False
        self._remember(token)

    def _remember(self, token: str) -> None:
        """Later writers of this process guess that the stream's token is `token`."""
        if len(_SEEN_TOKENS) >= _SEEN_MAX:
            _SEEN_TOKENS.clear()
        _SEEN_TOKENS[self._key] = token

    def _fenced(self, current: str) -> WriterFencedError:
        return WriterFencedError(
            f"{self._what} was taken over by another writer (its fencing token is now "
            f"{current!r}); this attempt (partition {self.writer.partition}, attempt "
            f"{self.writer.attempt}, batch {self.writer.batch}) is stale and stops without "
            "writing more",
            stream=self.name,
        )

    # -- the lease ----------------------------------------------------------------------

    def release(self) -> None:
        """Mark the stream free for other partitions (keeps progress in the token)."""
        lease, taking = self._lease, self._taking
        self._lease, self._taking = None, False
        if lease is None or taking:
            return  # nothing held (a take never sent holds nothing)
        released = dataclasses.replace(lease, held=False)
        raw = released.encode()
        try:
            self._fence(raw, self._last_token)
            self._saw(raw)
        except FencingTokenMismatchError as exc:
            # Everything we appended is acknowledged; whoever took over continues.
            self._saw(exc.expected_token)
        self._tail = None

    def _fence(self, token: str, current: str) -> AppendAck:
        """Set the token if it is `current`."""
        entry, metered = fence_entry(token)
        with self._budget.hold(1):
            return self._stream.append_payload(AppendBatch(entry, 1, metered, 0),
                                               fencing_token=current, idempotent=True)

    def _check_cancel(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise _Cancelled(f"{self._what}: stopped, another stream of this task failed")

    def _probe(self) -> str:
        """The stream's current fencing token, learnt from a fence that cannot match."""
        try:
            self._with_stream(lambda: self._fence(_PROBE, _PROBE))
        except FencingTokenMismatchError as exc:
            self._remember(exc.expected_token)
            return exc.expected_token
        return _PROBE

    def _with_stream(self, op: Callable[[], object]) -> object:
        """Run `op`, creating the stream first if it is missing and createStreams is on."""
        try:
            return op()
        except NotFoundError:
            self._create_missing()
            return op()

    def _create_missing(self) -> None:
        """The stream does not exist: create it (createStreams), or say so."""
        if not self.settings.create_streams:
            raise S2NotFoundError(
                f"{self._what} does not exist: create it first, or set the writer "
                "option createStreams=true", status=404, code="stream_not_found",
            ) from None
        with contextlib.suppress(AlreadyExistsError):
            self._basin.create_stream(self.name)

    def _acquire(self) -> None:
        """Decide how to take the stream's lease from the token it has (a guess until the
        service has shown it), waiting while another partition holds it. The lease is
        taken by the next append (`_taking`)."""
        raw, guessed = self._last_token, self._guessed
        seen_at = time.monotonic()
        delay = self.settings.poll_initial
        while True:
            self._check_cancel()
            stolen = (not guessed) and (time.monotonic() - seen_at >= self.settings.lease_timeout)
            d = decide(self.writer, raw, stolen=stolen, known=self._progress, what=self._what)
            if d.kind == "stale":
                raise WriterFencedError(
                    f"{self._what}: this attempt (partition {self.writer.partition}, attempt "
                    f"{self.writer.attempt}, batch {self.writer.batch}) is stale ({d.reason}) "
                    "and stops without writing", stream=self.name,
                )
            if d.kind == "wait":
                if not guessed:
                    if self._on_wait is not None:
                        self._on_wait(self)
                    time.sleep(delay)
                    delay = min(delay * 2, self.settings.poll_max)
                new, guessed = self._probe(), False
                if new != raw:
                    seen_at = time.monotonic()
                    raw = new
                continue
            progress, clean = d.progress, d.clean
            if d.scan:
                scanned = FenceRecords(self._stream, self._what).progress_of(self.writer)
                progress, clean = max(scanned, self._progress if self._known else 0), False
            self._lease = self.writer.lease(held=True, clean=clean and not stolen,
                                            progress=progress)
            self._taking, self._tail = True, None
            self._last_token, self._guessed = raw, guessed
            return

    def _take_without_data(self) -> None:
        """Take the lease by a fence alone (every buffered row is in the stream already):
        the stream must show this attempt as its writer, so older ones stop."""
        lease = self._lease
        assert lease is not None
        token = lease.encode()
        try:
            ack = self._with_stream(lambda: self._fence(token, self._last_token))
        except FencingTokenMismatchError as exc:
            self._lease, self._taking = None, False
            self._saw(exc.expected_token)
            raise _TakeRefused() from None
        self._taking = False
        self._saw(token)
        self._progress, self._known = lease.progress, True
        self._tail = ack.end.seq_num  # type: ignore[attr-defined]
        self.last_append = time.monotonic()
