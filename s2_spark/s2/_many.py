"""Operations on many streams of a basin at once: tails, small reads, single appends and
creations, sent together.

S2 has no call that answers for several streams, so each stream costs a request; sent
through the client's `Fanout` they cost a third of the CPU of a thread each and go out as
fast as the service answers. A request that fails there (a cut connection, a 5xx, an
answer that is not the plain success) is made again alone through the stream's own
client, which retries by deadline and raises the typed error, so each result is what the
single-stream call would have given.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import httpx

from s2_spark._http import (
    MAX_BODY_BYTES,
    BodyDecodingError,
    BodyTooLargeError,
    Call,
    Response,
    query,
)
from s2_spark._http._bulk import BULK_TAILS
from s2_spark.errors import AlreadyExistsError, NotFoundError, Position, S2Error, ServiceError
from s2_spark.wire.frames import Compression

from ._acks import PROTO_ACCEPT, PROTO_HEADERS, ack_objects, ack_of, acks_of
from ._errors import error_from_decoding, error_from_response, error_from_transport
from ._params import read_params
from ._stream import records_path
from ._transport import BasinRoute, Transport
from ._types import AppendAck

if TYPE_CHECKING:
    from s2_spark.wire.appends import AppendBatch
    from s2_spark.wire.records import DecodedBatch

    from ._stream import StreamClient

__all__ = ["Basin", "BodyAcks", "SingleAppend", "SmallRead", "append_bodies", "append_each",
           "check_tails", "create_streams", "read_many"]


@dataclass(frozen=True, slots=True)
class Basin:
    """What the calls on many streams need of a basin's client: its transport and name,
    and the single-stream calls a failed request is made again with. (`BasinClient` makes
    one; this module does not import it, so the two do not import each other.)"""

    transport: Transport
    name: str
    stream: Callable[[str], StreamClient]
    create_stream: Callable[[str], object]


@dataclass(frozen=True, slots=True)
class SmallRead:
    """One unary read: up to `count` records of `stream` from `seq_num`."""

    stream: str
    seq_num: int
    count: int


@dataclass(frozen=True, slots=True)
class SingleAppend:
    """One append of a pre-encoded batch to `stream`, under the given conditions."""

    stream: str
    batch: AppendBatch
    fencing_token: str | None = None
    match_seq_num: int | None = None


#: The most taken of an answer S2 makes a few hundred bytes at most (a tail, an ack, a
#: created stream, an error): a run's answers are held until its last, and 4,096 tail
#: lookups at `MAX_BODY_BYTES` each would let a server make a process hold 16 GiB (64 MiB
#: at this). A longer one (a proxy's error page) fails its call at once, never made
#: again (`BodyTooLargeError`: a server that sent it once sends it again).
SMALL_ANSWER = 16 << 10


def _too_large(result: object, what: str) -> S2Error | None:
    """The error of a call whose answer was over its limit, else None."""
    return error_from_decoding(result, what) if isinstance(result, BodyTooLargeError) else None


def _gets(basin: Basin, targets: Sequence[str], extra: list[tuple[bytes, bytes]],
          max_body: int = MAX_BODY_BYTES) -> list[Response | Exception]:
    transport = basin.transport
    route = transport.route(basin.name)
    headers = route.headers + extra
    return transport.fanout().run([Call(b"GET", route.origin.base_url, t, headers,
                                        max_body=max_body) for t in targets])


#: Tail lookups answered at a time by `check_tails`: 100,000 answers held at once before
#: being read cost a streaming reader's process a hundred megabytes it kept.
TAILS_AT_ONCE = 4096


#: A tail answer as S2 writes it: read without a JSON parser (a fifth of its cost); any
#: other spelling of the same JSON goes through `json.loads`, to the same result.
_TAIL = re.compile(
    rb'\{"tail":\{"seq_num":(0|[1-9][0-9]{0,19}),"timestamp":(0|[1-9][0-9]{0,19})\}\}')


def _tail_of(body: bytes) -> Position:
    """The position in a tail lookup's answer."""
    m = _TAIL.fullmatch(body)
    if m is not None:
        return Position(int(m[1]), int(m[2]))
    tail = json.loads(body)["tail"]
    return Position(int(tail["seq_num"]), int(tail["timestamp"]))


#: What `quote(name, safe="")` leaves as it is: a name of only these needs no quoting.
_UNQUOTED = re.compile(r"[A-Za-z0-9_.~-]*")


def _paths(names: Sequence[str], after: str = "") -> list[bytes]:
    """Each stream's `records_path`, `after` added (a tail lookup's "/tail"). Names that
    need no quoting (the usual kind) make all the paths in one pass of C: a name at a time
    through `records_path` cost 3 us more a lookup once a plan's names outnumber its
    cache, as 100,000 streams' do."""
    if names and _UNQUOTED.fullmatch("".join(names)):
        paths = f"/records{after}\n/streams/".join(names)
        return f"/streams/{paths}/records{after}".encode().split(b"\n")
    return [(records_path(n) + after).encode() for n in names]


def check_tails(basin: Basin, names: Sequence[str]) -> dict[str, Position | None]:
    """Each stream's tail, None where the stream does not exist or is being deleted."""
    out: dict[str, Position | None] = {}
    for i in range(0, len(names), TAILS_AT_ONCE):
        _check_tails(basin, names[i:i + TAILS_AT_ONCE], out)
    return out


def _check_tails(basin: Basin, names: Sequence[str], out: dict[str, Position | None]
                 ) -> None:
    if BULK_TAILS:
        _bulk_tails(basin, names, out)
        return
    results = _gets(basin, [records_path(n) + "/tail" for n in names], [], SMALL_ANSWER)
    for name, result in zip(names, results, strict=True):
        _tail_result(basin, name, result, out)


def _bulk_tails(basin: Basin, names: Sequence[str], out: dict[str, Position | None]
                ) -> None:
    """The tails read in bulk (`Fanout.run_tails`): a plain answer's position straight
    from the run's arrays, any other answer handled as `_tail_result` handles it."""
    route = basin.transport.route(basin.name)
    run = basin.transport.fanout().run_tails(
        route.origin.base_url, _paths(names, "/tail"), route.headers, SMALL_ANSWER)
    others = run.others
    if not others:  # the usual run: every answer a plain tail
        out.update(zip(names, map(Position, run.seqs, run.tss), strict=True))
        return
    for i, (name, seq, ts) in enumerate(zip(names, run.seqs, run.tss, strict=True)):
        if i in others:
            _tail_result(basin, name, others[i], out)
        else:
            out[name] = Position(seq, ts)


def _tail_result(basin: Basin, name: str, result: Response | Exception,
                 out: dict[str, Position | None]) -> None:
    """A tail lookup's answer (or failure) as its position, None for a missing stream,
    or made again alone."""
    if isinstance(result, Response) and result.status_code == 200:
        out[name] = _tail_of(result.content)
        return
    if (isinstance(result, Response)
            and isinstance(error_from_response(result, name), NotFoundError)):
        out[name] = None
        return
    if (too_large := _too_large(result, f"the tail of {name!r}")) is not None:
        raise too_large
    try:
        out[name] = basin.stream(name).check_tail()
    except NotFoundError:
        out[name] = None


def read_many(basin: Basin, reads: Sequence[SmallRead], *,
              include_command_records: bool, include_headers: bool
              ) -> list[DecodedBatch | S2Error]:
    """Each read's batch (as `StreamClient.read` gives it), or the error it ends with.
    The answers' records are decoded together into one Arrow batch, of which each read's
    is a slice (`decode_read_many`)."""
    from s2_spark.wire.records import decode_read_many

    bodies, others = _read_answers(basin, _read_targets(reads))
    streams = [r.stream for r in reads]
    if not others:  # the usual run: every read answered 200
        return list(decode_read_many(bodies, streams,  # type: ignore[arg-type]
                                     include_command_records=include_command_records,
                                     include_headers=include_headers))
    decoded = iter(decode_read_many(
        [body for body in bodies if body is not None],
        [s for s, body in zip(streams, bodies, strict=True) if body is not None],
        include_command_records=include_command_records, include_headers=include_headers))
    out: list[DecodedBatch | S2Error] = []
    for i, r in enumerate(reads):
        if bodies[i] is not None:
            out.append(next(decoded))
            continue
        result = others[i]
        if (too_large := _too_large(result, f"a read of {r.stream!r}")) is not None:
            out.append(too_large)
            continue
        try:
            out.append(basin.stream(r.stream).read(
                seq_num=r.seq_num, count=r.count, include_headers=include_headers,
                include_command_records=include_command_records))
        except S2Error as exc:
            out.append(exc)
    return out


def _u64s(values: list[int]) -> bool:
    """Whether each value is a plain int in [0, 2**64) (as `check_u64` takes, and as
    `query` writes in decimal)."""
    return not values or (set(map(type, values)) == {int}
                          and min(values) >= 0 and max(values) < 1 << 64)


def _read_targets(reads: Sequence[SmallRead]) -> list[bytes]:
    """Each read's target, `records_path` and `query(read_params(...))`'s. Plain ints
    (the usual kind) make them in one pass (`_paths`, a `%` each): built read by read
    through `read_params` and `query` they cost 3 us a read."""
    starts, counts = [r.seq_num for r in reads], [r.count for r in reads]
    if _u64s(starts) and _u64s(counts):
        return [b"%b?seq_num=%d&count=%d" % t
                for t in zip(_paths([r.stream for r in reads]), starts, counts, strict=True)]
    targets = []
    for r in reads:  # the checks' errors, as a read alone raises them
        params = read_params(seq_num=r.seq_num, timestamp=None, tail_offset=None,
                             count=r.count, bytes=None, until=None, clamp=False, wait=None)
        targets.append((records_path(r.stream) + query(params)).encode())
    return targets


def _read_answers(basin: Basin, targets: list[bytes]
                  ) -> tuple[list[bytes | None], dict[int, Response | Exception]]:
    """Each read's body where it was answered 200, else (in the dict) its answer or the
    error it failed with. A bulk run (`Fanout.run_reads`) where `BULK_TAILS`: its plain
    answers' bodies as they came, its others (a coded or chunked 200 among them) as the
    fan-out would give them, a 200's decoded body moved to the bodies."""
    if BULK_TAILS:
        route = basin.transport.route(basin.name)
        run = basin.transport.fanout().run_reads(
            route.origin.base_url, targets, route.headers + PROTO_ACCEPT, MAX_BODY_BYTES)
        bodies, others = run.bodies, run.others
    else:
        bodies, others = [None] * len(targets), dict(enumerate(_gets(
            basin, [t.decode() for t in targets], PROTO_ACCEPT)))
    for i, result in list(others.items()):
        if isinstance(result, Response) and result.status_code == 200:
            bodies[i] = result.content
            del others[i]
    return bodies, others


def append_each(basin: Basin, appends: Sequence[SingleAppend], *, in_flight: int,
                create_missing: bool = False) -> list[AppendAck | ServiceError]:
    """Each append's ack, or the error it failed with, never retried: an append cut short
    in transit may have landed, and only the caller knows how to find out (a writer reads
    its fencing token back). Such failures are `S2UnavailableError`s with `unsent` false.
    At most `in_flight` of them are sent and not yet answered at any time.

    `create_missing`: an append answered 404 creates its stream and is sent again at once
    under the empty fencing token (a new stream's, whoever created it), so a stream first
    met by one of several writers is created by it alone, before the others reach it."""
    route = basin.transport.route(basin.name)
    calls = _append_calls(route, [a.stream for a in appends],
                          [a.batch.to_append_input(a.match_seq_num, a.fencing_token)
                           for a in appends])
    then = (_CreateThenAppend(basin, [a.stream for a in appends],
                              lambda i: appends[i].batch.to_append_input(None, ""))
            if create_missing else None)
    results = basin.transport.fanout().run(calls, limit=in_flight, then=then)
    acks = iter(ack_objects([r.content for r in results if _plain(r)]))  # in one pass
    return [next(acks) if _plain(r) else _append_outcome(r, a.stream, basin.name)
            for a, r in zip(appends, results, strict=True)]


def _plain(result: Response | Exception) -> TypeGuard[Response]:
    """Whether a fan-out result is a 200 answer (an ack, most of them)."""
    return type(result) is Response and result.status_code == 200


@dataclass(slots=True)
class BodyAcks:
    """What `append_bodies` got: append i landed at `starts[i]` .. `ends[i]` (seq_nums, as
    its ack's start and end), unless `others` holds its outcome (an error, or an ack read
    by `ack_of` from an answer of another kind): plain ints, no object per append."""

    starts: list[int]
    ends: list[int]
    others: dict[int, AppendAck | ServiceError]


def append_bodies(basin: Basin, streams: Sequence[str], bodies: Sequence[bytes],
                  condition_sizes: Sequence[int], *, in_flight: int,
                  create_missing: bool = False) -> BodyAcks:
    """`append_each` for appends encoded whole already (AppendInput messages), their acks
    read in one pass into ints (`acks_of`): what a writer's first appends to thousands of
    streams cost, with no object per append but its request. `condition_sizes[i]`: the
    bytes of body i's last field, its fencing token condition, which a stream created
    on the way (`create_missing`) has replaced by the empty token's. The same outcomes as
    `append_each`, never retried. Uncompressed, they go as a bulk run (`_bulk_appends`)."""
    route = basin.transport.route(basin.name)
    if BULK_TAILS and route.compression is Compression.NONE:
        return _bulk_appends(basin, route, streams, bodies, condition_sizes, in_flight,
                             create_missing)
    calls = _append_calls(route, streams, bodies)
    then = (_CreateThenAppend(basin, streams, _Unconditioned(bodies, condition_sizes))
            if create_missing else None)
    results = basin.transport.fanout().run(calls, limit=in_flight, then=then)
    plain = [r.content for r in results if _plain(r)]
    if len(plain) == len(results):  # the common case: every append acknowledged
        return BodyAcks(*acks_of(plain), {})
    starts, ends = [0] * len(results), [0] * len(results)
    others: dict[int, AppendAck | ServiceError] = {}
    got = zip(*acks_of(plain), strict=True)
    for i, r in enumerate(results):
        if _plain(r):
            starts[i], ends[i] = next(got)
        else:
            others[i] = _append_outcome(r, streams[i], basin.name)
    return BodyAcks(starts, ends, others)


def _bulk_appends(basin: Basin, route: BasinRoute, streams: Sequence[str],
                  bodies: Sequence[bytes], condition_sizes: Sequence[int], in_flight: int,
                  create_missing: bool) -> BodyAcks:
    """`append_bodies` as a bulk run (`Fanout.run_appends`): the plain acks straight from
    the run's arrays, the few answered 404 created and appended again through the fan-out
    (`_CreateThenAppend`) when `create_missing`, any other outcome as `append_each`'s."""
    fanout = basin.transport.fanout()
    run = fanout.run_appends(route.origin.base_url, _paths(streams),
                             route.headers + PROTO_HEADERS, bodies, SMALL_ANSWER, in_flight)
    starts, ends, results = run.starts.tolist(), run.ends.tolist(), run.others
    if not results:  # the common case: every append acknowledged
        return BodyAcks(starts, ends, {})
    missing = [i for i, r in results.items()
               if isinstance(r, Response) and r.status_code == 404] if create_missing else []
    if missing:
        unconditioned = _Unconditioned(bodies, condition_sizes)
        then = _CreateThenAppend(basin, [streams[i] for i in missing],
                                 lambda k: unconditioned(missing[k]), created=True)
        again = fanout.run([_create_call(route, streams[i]) for i in missing],
                           limit=in_flight, then=then)
        results.update(zip(missing, again, strict=True))
    others: dict[int, AppendAck | ServiceError] = {}
    for i in sorted(results):  # in order, as the fan-out path gives them
        outcome = _append_outcome(results[i], streams[i], basin.name)
        if isinstance(outcome, AppendAck):  # a 200 spelt otherwise, or after a creation
            starts[i], ends[i] = outcome.start.seq_num, outcome.end.seq_num
        else:
            others[i] = outcome
    return BodyAcks(starts, ends, others)


class _Unconditioned:
    """Body i again under the empty fencing token (a stream just created has it)."""

    def __init__(self, bodies: Sequence[bytes], condition_sizes: Sequence[int]) -> None:
        self._bodies = bodies
        self._sizes = condition_sizes

    def __call__(self, i: int) -> bytes:
        body = self._bodies[i]
        return body[:len(body) - self._sizes[i]] + b"\x1a\x00"


def _append_outcome(result: Response | Exception, stream: str, basin: str
                    ) -> AppendAck | ServiceError:
    """One fan-out append's outcome as `append_each` gives it (raises what is neither an
    answer nor a failure it knows)."""
    what = f"stream {stream!r} in basin {basin!r}"
    if isinstance(result, Response) and result.status_code == 200:
        return ack_of(result.content)
    if isinstance(result, Response):
        return error_from_response(result, what)
    if isinstance(result, httpx.TransportError):
        return error_from_transport(result, what, "append", None)
    if isinstance(result, BodyDecodingError):
        return error_from_decoding(result, what)
    raise result


class _CreateThenAppend:
    """`append_each`'s follow-up: a 404 asks for the stream's creation, and the creation
    (or a 409: another writer's) for the append again under the empty token. `created`:
    the calls are those creations already (their appends were answered 404 elsewhere)."""

    def __init__(self, basin: Basin, streams: Sequence[str],
                 unconditioned: Callable[[int], bytes], *, created: bool = False) -> None:
        self._route = basin.transport.route(basin.name)
        self._streams = streams
        self._unconditioned = unconditioned  # append i's AppendInput under token ""
        self._first = int(created)  # the step a call's first answer is at
        self._steps: dict[int, int] = {}  # only the few answered 404 take a step

    def __call__(self, i: int, response: Response) -> Call | None:
        step = self._steps.get(i, self._first)
        if step == 0 and response.status_code != 404:
            return None
        self._steps[i] = step + 1
        if step == 0:
            return _create_call(self._route, self._streams[i])
        if step == 1 and response.status_code in (200, 201, 409):
            return _append_call(self._route, self._streams[i], self._unconditioned(i))
        return None


def _append_call(route: BasinRoute, name: str, append_input: bytes) -> Call:
    """A protobuf append to stream `name` (its body compressed as the route says)."""
    body, encoded = route.body(append_input)
    return Call(b"POST", route.origin.base_url, records_path(name),
                route.headers + PROTO_HEADERS + encoded, body, SMALL_ANSWER)


def _append_calls(route: BasinRoute, streams: Sequence[str], bodies: Sequence[bytes]
                  ) -> list[Call]:
    """`_append_call` for each stream and body; uncompressed, the bodies go as they are
    and the calls share one header list (no list built per call)."""
    if route.compression is not Compression.NONE:
        return [_append_call(route, name, body)
                for name, body in zip(streams, bodies, strict=True)]
    base, headers = route.origin.base_url, route.headers + PROTO_HEADERS
    return [Call(b"POST", base, records_path(name), headers, body, SMALL_ANSWER)
            for name, body in zip(streams, bodies, strict=True)]


def _create_call(route: Any, name: str) -> Call:
    """A create of stream `name`, with a request token of its own (a repeat cannot create
    twice)."""
    return Call(b"POST", route.origin.base_url, "/streams",
                [*route.headers, (b"content-type", b"application/json"),
                 (b"s2-request-token", uuid.uuid4().hex.encode())],
                json.dumps({"stream": name}).encode(), SMALL_ANSWER)


def create_streams(basin: Basin, names: Sequence[str]) -> None:
    """Create the streams that do not exist yet, the requests sent together (each with
    its own request token, so a repeat cannot create twice); a failed one is made again
    alone, with retries. Streams that exist already are left as they are."""
    route = basin.transport.route(basin.name)
    results = basin.transport.fanout().run([_create_call(route, n) for n in names])
    for name, result in zip(names, results, strict=True):
        if isinstance(result, Response) and (
                result.status_code in (200, 201)
                or isinstance(error_from_response(result, name), AlreadyExistsError)):
            continue
        if (too_large := _too_large(result, f"the creation of {name!r}")) is not None:
            raise too_large
        with contextlib.suppress(AlreadyExistsError):
            basin.create_stream(name)
