"""Did an append whose response was lost actually land? Read it back and compare.

Used only after an ambiguous failure (the request may have reached S2) followed by a
412 seq_num mismatch on the conditioned retry: if the records between the expected
position and the stream's new tail are exactly the batches we sent, the earlier attempt
succeeded and the 412 was caused by our own write, so the append is reported as done.
Anything else (another writer's records) keeps the 412.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

from s2_spark._proto import s2_pb2
from s2_spark.errors import Position

from ._acks import PROTO_ACCEPT
from ._transport import Transport
from ._types import AppendAck

if TYPE_CHECKING:
    from s2_spark.wire.appends import AppendBatch

__all__ = ["landed_batches"]


def _expected(batch: AppendBatch) -> list[tuple[bytes, list[tuple[bytes, bytes]]]]:
    msg = s2_pb2.AppendInput.FromString(b"".join(batch.records_parts()))
    return [(r.body, [(h.name, h.value) for h in r.headers]) for r in msg.records]


def landed_batches(
    transport: Transport,
    basin: str,
    stream: str,
    batches: Sequence[AppendBatch],
    start_seq: int,
    tail_seq: int,
) -> list[AppendAck] | None:
    """Acks for the first k batches if records [start_seq, tail_seq) are exactly them."""
    from s2_spark.wire.records import read_batch_prefix

    total = tail_seq - start_seq
    k, covered = 0, 0
    while covered < total and k < len(batches):
        covered += batches[k].count
        k += 1
    if k == 0 or covered != total:
        return None
    got: list[s2_pb2.SequencedRecord] = []
    path = f"/streams/{quote(stream, safe='')}/records"
    target = f"stream {stream!r} in basin {basin!r}"
    while len(got) < total:
        resp = transport.request(
            "GET",
            path,
            basin=basin,
            target=target,
            params={"seq_num": start_seq + len(got), "count": min(1000, total - len(got))},
            headers=PROTO_ACCEPT,
            salvage=read_batch_prefix,
        )
        records = s2_pb2.ReadBatch.FromString(resp.content).records
        if not records:
            return None
        got.extend(records)
    if [r.seq_num for r in got] != list(range(start_seq, tail_seq)):
        return None
    acks: list[AppendAck] = []
    i = 0
    for batch in batches[:k]:
        part = got[i : i + batch.count]
        if [(r.body, [(h.name, h.value) for h in r.headers]) for r in part] != _expected(batch):
            return None
        i += batch.count
        acks.append(
            AppendAck(
                Position(part[0].seq_num, part[0].timestamp),
                Position(part[-1].seq_num + 1, part[-1].timestamp),
                Position(tail_seq, got[-1].timestamp),
            )
        )
    return acks
