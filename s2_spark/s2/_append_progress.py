"""How far an append of many batches has got, and what its failures allow next.

`StreamClient.append_batches` sends batches in S2S sessions of at most
`MAX_INPUTS_PER_SESSION` inputs and keeps one `BatchesProgress`: the acks so far, how
many batches they cover, the condition of the next batch (`match_seq_num` counted on from
the acks, or None without one) and whether a failed attempt may have landed unseen
(`ambiguous`). After a failure it tells the three ways on apart:

* a 412 whose tail is past the condition after an ambiguous failure: the lost session's
  inputs may be ours (`landed_tail`; the caller reads them back to settle it);
* a retryable failure after sending, without a condition: a blind retry could duplicate
  records, so `failed` returns the error to raise instead;
* anything else goes to the retry loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from s2_spark.errors import S2UnavailableError, SeqNumMismatchError, ServiceError

from ._types import AppendAck

if TYPE_CHECKING:
    from s2_spark.wire.appends import AppendBatch

__all__ = ["BatchesProgress"]


@dataclass
class BatchesProgress:
    """The acknowledged prefix of `batches` and the condition of the next one."""

    batches: Sequence[AppendBatch]
    next_match: int | None
    first: AppendAck | None = None
    last: AppendAck | None = None
    done: int = 0
    ambiguous: bool = False  # a failed attempt may have appended without an ack

    @property
    def finished(self) -> bool:
        return self.done >= len(self.batches)

    def pending(self, limit: int) -> Sequence[AppendBatch]:
        """The next `limit` batches not yet acknowledged."""
        return self.batches[self.done : self.done + limit]

    def acked(self, acks: Sequence[AppendAck]) -> bool:
        """Count a session's acks (and condition the next batch on their end); True when
        there were any."""
        if not acks:
            return False
        self.first = self.first or acks[0]
        self.last = acks[-1]
        self.done += len(acks)
        if self.next_match is not None:
            self.next_match = acks[-1].end.seq_num
        return True

    def landed_tail(self, err: ServiceError) -> int | None:
        """The tail a 412 reports past the condition after an ambiguous failure: the failed
        session's inputs may have landed up to it. None when that cannot be."""
        if (
            self.ambiguous
            and self.next_match is not None
            and isinstance(err, SeqNumMismatchError)
            and err.expected_seq_num > self.next_match
        ):
            return err.expected_seq_num
        return None

    def recovered(self, acks: Sequence[AppendAck], tail_seq: int) -> None:
        """The next batches were found landed (read back) up to `tail_seq`: skip them."""
        self.first = self.first or acks[0]
        self.last = acks[-1]
        self.done += len(acks)
        self.next_match = tail_seq
        self.ambiguous = False

    def failed(self, err: ServiceError) -> S2UnavailableError | None:
        """Note a failure; returns the error to raise instead of retrying when a retry
        could duplicate records (sent, outcome unknown, no condition), else None."""
        self.ambiguous = self.ambiguous or not err.unsent
        if not (err.retryable and self.next_match is None and not err.unsent):
            return None
        records_done = sum(b.count for b in self.batches[: self.done])
        total = sum(b.count for b in self.batches)
        return S2UnavailableError(
            f"{err.message}. {records_done} of {total} records were acknowledged "
            f"before the failure; the outcome of the next batch is unknown, so it was "
            "not retried (that could duplicate records). Check the stream's tail, or "
            "pass match_seq_num to make retries safe",
            status=err.status,
            code=err.code,
        )

    def span(self) -> AppendAck:
        """The span appended: from the first ack's start to the last one's end."""
        assert self.first is not None and self.last is not None
        return AppendAck(self.first.start, self.last.end, self.last.tail)
