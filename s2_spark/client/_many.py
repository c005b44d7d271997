"""Operations on many streams of a basin at once: tails and small reads, sent together.

S2 has no call that answers for several streams, so each stream costs a request; sent
through the client's `Fanout` they cost a third of the CPU of a thread each and go out as
fast as the service answers. A request that fails there (a cut connection, a 5xx, an
answer that is not the plain success) is made again alone through the stream's own
client, which retries by deadline and raises the typed error, so each result is what the
single-stream call would have given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from s2_spark._http import Call, Response, query
from s2_spark.errors import Position, S2Error

from ._append_session import PROTO_ACCEPT
from ._params import read_params

if TYPE_CHECKING:
    from s2_spark.wire.records import DecodedBatch

    from ._client import BasinClient

__all__ = ["SmallRead", "check_tails", "read_many"]


@dataclass(frozen=True, slots=True)
class SmallRead:
    """One unary read: up to `count` records of `stream` from `seq_num`."""

    stream: str
    seq_num: int
    count: int


def _calls(basin: BasinClient, targets: Sequence[str], extra: list[tuple[bytes, bytes]]
           ) -> list[Response | Exception]:
    transport = basin._transport
    route = transport.route(basin.name)
    headers = route.headers + extra
    return transport.fanout().run(
        [Call(b"GET", route.origin.base_url, t, headers) for t in targets])


def check_tails(basin: BasinClient, names: Sequence[str]) -> dict[str, Position | None]:
    """Each stream's tail, None where the stream does not exist."""
    results = _calls(basin, [f"/streams/{quote(n, safe='')}/records/tail" for n in names], [])
    out: dict[str, Position | None] = {}
    for name, result in zip(names, results, strict=True):
        if isinstance(result, Response) and result.status_code == 404:
            out[name] = None
            continue
        if isinstance(result, Response) and result.status_code == 200:
            tail = result.json()["tail"]
            out[name] = Position(int(tail["seq_num"]), int(tail["timestamp"]))
            continue
        try:
            out[name] = basin.stream(name).check_tail()
        except S2Error as exc:
            if exc.status != 404:
                raise
            out[name] = None
    return out


def read_many(basin: BasinClient, reads: Sequence[SmallRead], *,
              include_command_records: bool, include_headers: bool
              ) -> list[DecodedBatch | S2Error]:
    """Each read's batch (as `StreamClient.read` gives it), or the error it ends with."""
    from s2_spark.wire.records import decode_read_batch

    targets = []
    for r in reads:
        params = read_params(seq_num=r.seq_num, timestamp=None, tail_offset=None,
                             count=r.count, bytes=None, until=None, clamp=False, wait=None)
        targets.append(f"/streams/{quote(r.stream, safe='')}/records{query(params)}")
    out: list[DecodedBatch | S2Error] = []
    for r, result in zip(reads, _calls(basin, targets, PROTO_ACCEPT), strict=True):
        if isinstance(result, Response) and result.status_code == 200:
            out.append(decode_read_batch(result.content, r.stream,
                                         include_command_records=include_command_records,
                                         include_headers=include_headers))
            continue
        try:
            out.append(basin.stream(r.stream).read(
                seq_num=r.seq_num, count=r.count, include_headers=include_headers,
                include_command_records=include_command_records))
        except S2Error as exc:
            out.append(exc)
    return out
