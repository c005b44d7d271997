"""StreamClient: the data plane of one stream (tail, reads, read sessions, appends)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

from s2_spark.errors import Position, S2BadRequestError, SeqNumMismatchError, ServiceError
from s2_spark.retry import RetryLoop, RetryPolicy

from ._acks import PROTO_ACCEPT, PROTO_HEADERS, ack_of
from ._config import S2Config
from ._limits import MAX_INPUTS_PER_SESSION
from ._params import check_u64, read_params
from ._read_session import ReadSession
from ._transport import Transport
from ._types import MAX_BATCH_BYTES, MAX_BATCH_RECORDS, AppendAck, AppendRecord

if TYPE_CHECKING:
    from s2_spark.wire.appends import AppendBatch
    from s2_spark.wire.records import DecodedBatch

    from ._append_progress import BatchesProgress
    from ._append_session import SessionResult

__all__ = ["StreamClient", "records_path"]


@functools.lru_cache(maxsize=16384)
def records_path(stream: str) -> str:
    """The path of a stream's records (the name quoted once: a writer of many streams
    asks for the same ones every micro-batch; more than that many streams are quoted
    again, rather than held: 100,000 paths cost a streaming reader 12 MB)."""
    return f"/streams/{quote(stream, safe='')}/records"


class StreamClient:
    """Reads and appends on one stream of one basin. Cheap to create; thread-safe."""

    def __init__(self, transport: Transport, basin: str, name: str) -> None:
        self._t = transport
        self.basin = basin
        self.name = name
        self._path = records_path(name)
        self._target = f"stream {name!r} in basin {basin!r}"

    def __repr__(self) -> str:
        return f"StreamClient(basin={self.basin!r}, stream={self.name!r})"

    @property
    def config(self) -> S2Config:
        """The client's configuration (retry policy, timeouts, endpoints)."""
        return self._t.config

    # -- reads ------------------------------------------------------------------------------

    def check_tail(self) -> Position:
        """The next seq_num to be assigned and the timestamp of the last record."""
        resp = self._t.request("GET", self._path + "/tail", basin=self.basin, target=self._target)
        tail = resp.json()["tail"]
        return Position(int(tail["seq_num"]), int(tail["timestamp"]))

    def read(
        self,
        *,
        seq_num: int | None = None,
        timestamp: int | None = None,
        tail_offset: int | None = None,
        count: int | None = None,
        bytes: int | None = None,
        until: int | None = None,
        clamp: bool = False,
        wait: float | None = None,
        include_command_records: bool = True,
        include_headers: bool = True,
        retry: RetryPolicy | None = None,
    ) -> DecodedBatch:
        """One unary read (protobuf): at most 1000 records / 1 MiB, decoded to Arrow.

        A unary read is always bounded, so starting at the tail (or, with `clamp`, beyond
        it) raises ReadPastTailError unless `wait` (seconds, S2 caps it at 60) lets records
        arrive; an empty batch then means none did. An answer cut short in transit returns
        the records that arrived whole (like the 1 MiB cap, fewer than asked for); it is
        asked for again only when not one did. `retry` overrides the client's policy.
        """
        from s2_spark.wire.records import decode_read_batch, read_batch_prefix

        params = read_params(
            seq_num=seq_num,
            timestamp=timestamp,
            tail_offset=tail_offset,
            count=count,
            bytes=bytes,
            until=until,
            clamp=clamp,
            wait=wait,
        )
        resp = self._t.request(
            "GET",
            self._path,
            basin=self.basin,
            target=self._target,
            params=params,
            headers=PROTO_ACCEPT,
            extra_read_time=float(params.get("wait", 0)),
            salvage=read_batch_prefix,
            policy=retry,
        )
        return decode_read_batch(
            resp.content,
            self.name,
            include_command_records=include_command_records,
            include_headers=include_headers,
        )

    def read_session(
        self,
        *,
        seq_num: int | None = None,
        timestamp: int | None = None,
        tail_offset: int | None = None,
        count: int | None = None,
        bytes: int | None = None,
        until: int | None = None,
        clamp: bool = False,
        wait: float | None = None,
        include_command_records: bool = True,
        include_headers: bool = True,
        heartbeats: bool = False,
        batch_bytes: int | None = None,
    ) -> ReadSession:
        """A streaming read (S2S) yielding one DecodedBatch per data frame.

        Ends when count/bytes/until is reached or the server ends the session (for example
        after `wait` seconds without records); reconnects transparently otherwise. With
        `heartbeats=True` heartbeat frames are yielded too, as batches of 0 rows with `tail`.
        With `batch_bytes`, consecutive data frames are decoded together into one
        DecodedBatch of about that many payload bytes (one Arrow batch, one decode, for a
        catch-up read's frames that come back to back); frames are held until then, so it
        is for reads without `wait` or heartbeats.
        """
        params = read_params(
            seq_num=seq_num,
            timestamp=timestamp,
            tail_offset=tail_offset,
            count=count,
            bytes=bytes,
            until=until,
            clamp=clamp,
            wait=wait,
        )
        return ReadSession(
            self._t,
            self.basin,
            self.name,
            params,
            wait=wait,
            include_command_records=include_command_records,
            include_headers=include_headers,
            heartbeats=heartbeats,
            batch_bytes=batch_bytes,
        )

    # -- appends ----------------------------------------------------------------------------

    def append(
        self,
        records: Sequence[AppendRecord],
        *,
        match_seq_num: int | None = None,
        fencing_token: str | None = None,
        idempotent: bool = False,
    ) -> AppendAck:
        """Append one batch (1-1000 records, <= 1 MiB metered) atomically.

        Retries: only when a retry cannot duplicate records, i.e. the request provably
        had no effect (connect errors, a body cut before its end, or an answer S2
        guarantees changed nothing: 429 rate_limited, 502 hot_server, 503
        server_draining, 409 transaction_conflict; see `_error_codes`), `match_seq_num` is
        set (a repeated attempt then fails with 412 instead of appending twice), or
        `idempotent` says a repeat is harmless (command records: setting a token twice,
        trimming twice). Other failures (503 unavailable, 500, 504, ...) raise
        S2UnavailableError saying the outcome is unknown.
        """
        records = list(records)
        if not records:
            raise S2BadRequestError(f"append to {self._target} needs at least one record")
        if len(records) > MAX_BATCH_RECORDS:
            raise S2BadRequestError(
                f"append to {self._target} got {len(records)} records; one batch holds at "
                f"most {MAX_BATCH_RECORDS}: use append_many to split it"
            )
        from ._encode import encode_append_records  # the append path: not a reader's

        batches = encode_append_records(records)
        if len(batches) != 1:
            total = sum(r.metered_bytes for r in records)
            raise S2BadRequestError(
                f"append to {self._target} got {total} metered bytes; one batch holds at most "
                f"{MAX_BATCH_BYTES} (1 MiB): use append_many to split it"
            )
        return self.append_payload(
            batches[0], match_seq_num=match_seq_num, fencing_token=fencing_token,
            idempotent=idempotent,
        )

    def append_payload(
        self,
        batch: AppendBatch,
        *,
        match_seq_num: int | None = None,
        fencing_token: str | None = None,
        idempotent: bool = False,
    ) -> AppendAck:
        """Append a batch pre-encoded by `s2_spark.wire.appends` (same retry rules as
        `append`; `idempotent` says a repeat is harmless, as for command records). If a
        retry with `match_seq_num` meets 412 after an attempt whose outcome was unknown,
        the records are read back: if they are ours, the append succeeded."""
        if match_seq_num is not None:
            check_u64("match_seq_num", match_seq_num)
        body = batch.to_append_input(match_seq_num, fencing_token)
        ambiguous = False

        def note(err: ServiceError) -> None:
            nonlocal ambiguous
            ambiguous = ambiguous or not err.unsent

        try:
            resp = self._t.request(
                "POST",
                self._path,
                basin=self.basin,
                target=self._target,
                content=body,
                headers=PROTO_HEADERS,
                retry="always" if match_seq_num is not None or idempotent else "unsent",
                on_retry=note,
            )
        except SeqNumMismatchError as e:
            # A retry after a lost response may fail only because the first attempt landed.
            if ambiguous and match_seq_num is not None:
                from ._verify import landed_batches

                acks = landed_batches(
                    self._t, self.basin, self.name, [batch], match_seq_num, e.expected_seq_num
                )
                if acks:
                    return acks[0]
            raise
        return ack_of(resp.content)

    def append_many(
        self,
        records: Iterable[AppendRecord],
        *,
        fencing_token: str | None = None,
        match_seq_num: int | None = None,
    ) -> AppendAck:
        """Append any number of records, in order, in batches within S2's limits.

        Batches go out over S2S append sessions (in order; measured about 2x faster than
        one unary request per batch). With `match_seq_num` each batch is conditioned on
        the previous one's end, so the run lands contiguously or fails with 412, and a
        failed session is resumed at its first unacknowledged batch. Without it a failure
        after sending is raised (a blind retry could duplicate records). Not atomic:
        batches acknowledged before a failure stay appended.
        """
        from ._encode import encode_append_records

        batches = encode_append_records(list(records))
        if not batches:
            raise S2BadRequestError(f"append_many to {self._target} needs at least one record")
        return self.append_batches(
            batches, match_seq_num=match_seq_num, fencing_token=fencing_token
        )

    def append_batches(
        self,
        batches: Sequence[AppendBatch],
        *,
        match_seq_num: int | None = None,
        fencing_token: str | None = None,
    ) -> AppendAck:
        """Append pre-encoded batches (from `s2_spark.wire.appends`) in order; see
        `append_many` for ordering, conditions and retries. Returns the span appended."""
        if not batches:
            raise S2BadRequestError(f"append_batches to {self._target} needs at least one batch")
        if match_seq_num is not None:
            check_u64("match_seq_num", match_seq_num)
        if len(batches) == 1:
            return self.append_payload(
                batches[0], match_seq_num=match_seq_num, fencing_token=fencing_token
            )
        from ._append_progress import BatchesProgress
        from ._append_session import run_append_session  # not imported by a reader

        loop = RetryLoop(self._t.config.retry, f"append_batches to {self._target}")
        run = BatchesProgress(batches, match_seq_num)
        while not run.finished:
            res = run_append_session(
                self._t,
                self.basin,
                self.name,
                run.pending(MAX_INPUTS_PER_SESSION),
                match_seq_num=run.next_match,
                fencing_token=fencing_token,
            )
            if run.acked(res.acks):
                loop.progressed()
            err = res.error
            if err is None:
                continue
            tail_seq = run.landed_tail(err)
            if tail_seq is not None and self._skip_landed(run, tail_seq):
                loop.progressed()
                continue
            unknown = run.failed(err)
            if unknown is not None:
                raise unknown from err
            loop.failed(err)
        return run.span()

    def _skip_landed(self, run: BatchesProgress, tail_seq: int) -> bool:
        """Read back the records up to `tail_seq` that a failed session may have appended;
        if they are the next batches, count them as appended (True)."""
        from ._verify import landed_batches

        assert run.next_match is not None
        acks = landed_batches(
            self._t, self.basin, self.name, run.batches[run.done :], run.next_match, tail_seq
        )
        if not acks:
            return False
        run.recovered(acks, tail_seq)
        return True

    def append_chain(
        self,
        batches: Sequence[AppendBatch],
        *,
        fencing_tokens: Sequence[str | None],
        match_seq_num: int | None = None,
    ) -> SessionResult:
        """Send `batches` in one S2S session without waiting for acks in between; input k is
        conditioned on `fencing_tokens[k]` and on the end of input k-1 (from
        `match_seq_num`, counted from the batches).

        Returns the acks of the prefix that landed and the error that stopped the rest. A
        failure that provably changed nothing (a connect error, or an answer S2 guarantees
        had no side effect, see `_error_codes`) is retried under the config's retry policy
        (raising once it gives up); any other outcome is
        returned, not retried: only the caller knows how to settle it (for example by
        reading the fencing token back).
        """
        if not batches or len(batches) > MAX_INPUTS_PER_SESSION:
            raise S2BadRequestError(
                f"append_chain to {self._target} takes 1..{MAX_INPUTS_PER_SESSION} batches, "
                f"got {len(batches)}"
            )
        if match_seq_num is not None:
            check_u64("match_seq_num", match_seq_num)
        from ._append_session import run_append_session  # not imported by a reader

        loop = RetryLoop(self._t.config.retry, f"append session of {self._target}")
        while True:
            res = run_append_session(
                self._t, self.basin, self.name, batches,
                match_seq_num=match_seq_num, fencing_tokens=fencing_tokens,
            )
            err = res.error
            if err is None or not (err.unsent and err.retryable):
                return res
            loop.failed(err)

    def fence(
        self, token: str, *, fencing_token: str | None = None, match_seq_num: int | None = None
    ) -> AppendAck:
        """Set the stream's fencing token (a `fence` command record; "" clears it).

        Retried like a read: setting a token twice is harmless, and a repeat conditioned on
        `fencing_token` after the first attempt landed fails with FencingTokenMismatchError
        naming `token`."""
        return self.append(
            [AppendRecord.fence(token)], fencing_token=fencing_token,
            match_seq_num=match_seq_num, idempotent=True,
        )

    def trim(
        self,
        earliest_seq_num: int,
        *,
        fencing_token: str | None = None,
        match_seq_num: int | None = None,
    ) -> AppendAck:
        """Ask S2 to drop records before `earliest_seq_num` (a `trim` command record;
        retried like a read, since trimming twice is harmless)."""
        return self.append(
            [AppendRecord.trim(earliest_seq_num)],
            fencing_token=fencing_token,
            match_seq_num=match_seq_num,
            idempotent=True,
        )
