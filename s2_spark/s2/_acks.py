"""What S2's requests send as content types and how an AppendAck answer is read: shared by
the unary calls (tails, appends), the many-stream calls (`_many`) and the sessions.

Apart from `_append_session` so that reading (a source runner looking up tails) does not
import the append session and what it imports.
"""

from __future__ import annotations

from s2_spark._proto import s2_pb2
from s2_spark.errors import Position
from s2_spark.wire._accelerator import fastwire

from ._types import AppendAck

__all__ = ["PROTO_ACCEPT", "PROTO_HEADERS", "SESSION_HEADERS", "ack_objects", "ack_of",
           "acks_of"]

#: What an S2S session (append or read) sends beside the basin's own headers.
SESSION_HEADERS = [(b"content-type", b"s2s/proto"), (b"accept", b"s2s/proto")]
#: What a protobuf request (a unary read or append) sends beside the basin's headers.
PROTO_ACCEPT = [(b"accept", b"application/protobuf")]
PROTO_HEADERS = [(b"content-type", b"application/protobuf"), *PROTO_ACCEPT]


def ack_of(raw: bytes | memoryview) -> AppendAck:
    """An AppendAck answer (protobuf, or an S2S frame's body), decoded."""
    a = s2_pb2.AppendAck.FromString(raw)
    return AppendAck(
        Position(a.start.seq_num, a.start.timestamp),
        Position(a.end.seq_num, a.end.timestamp),
        Position(a.tail.seq_num, a.tail.timestamp),
    )


def acks_of(answers: list[bytes]) -> tuple[list[int], list[int]]:
    """The start and end seq_num of many AppendAck answers (protobuf), as `ack_of` reads
    them, in one pass where the C decoders are (no object per answer); an answer that is
    not a plain AppendAck is decoded by `ack_of` itself, which raises as it does for
    one answer."""
    n = len(answers)
    if fastwire is None:
        acks = [ack_of(a) for a in answers]
        return [a.start.seq_num for a in acks], [a.end.seq_num for a in acks]
    raw, odd = fastwire.append_acks(answers)
    values = memoryview(raw).cast("Q")
    starts, ends = values[0:6 * n:6].tolist(), values[2:6 * n:6].tolist()
    for i in odd:
        ack = ack_of(answers[i])
        starts[i], ends[i] = ack.start.seq_num, ack.end.seq_num
    return starts, ends


def ack_objects(answers: list[bytes]) -> list[AppendAck]:
    """`ack_of` of each of many answers, read in one C call where the accelerator is (the
    protobuf parser's objects cost more than the acks made from its numbers)."""
    if fastwire is None:
        return [ack_of(a) for a in answers]
    raw, odd = fastwire.append_acks(answers)
    v = memoryview(raw).cast("Q").tolist()
    acks = [AppendAck(Position(v[i], v[i + 1]), Position(v[i + 2], v[i + 3]),
                      Position(v[i + 4], v[i + 5])) for i in range(0, len(v), 6)]
    for i in odd:
        acks[i] = ack_of(answers[i])
    return acks
