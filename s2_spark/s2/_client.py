"""S2Client (account operations) and BasinClient (stream control plane)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from s2_spark._closeable import Closeable
from s2_spark.errors import Position, S2BadRequestError, S2Error, S2NotFoundError, ServiceError

from . import _many
from ._config import S2Config
from ._many import SingleAppend, SmallRead
from ._stream import StreamClient
from ._transport import Transport
from ._types import BasinInfo, StreamConfig, StreamInfo

if TYPE_CHECKING:
    from s2_spark.wire.records import DecodedBatch

    from ._types import AppendAck
    from ._watch import TailWatch

__all__ = ["BasinClient", "S2Client"]

_BASIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def check_basin_name(name: str) -> str:
    """Validate a basin name locally so a typo fails before any request is made."""
    if (
        not isinstance(name, str)
        or not 8 <= len(name) <= 48
        or not set(name) <= _BASIN_CHARS
        or name.startswith("-")
        or name.endswith("-")
    ):
        raise S2BadRequestError(
            f"invalid basin name {name!r}: S2 accepts 8-48 characters of lowercase letters, "
            "digits and hyphens, not starting or ending with a hyphen"
        )
    return name


def check_stream_name(name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name.encode()) <= 512:
        raise S2BadRequestError(f"invalid stream name {name!r}: S2 accepts 1-512 bytes of UTF-8")
    return name


def _delete(transport: Transport, path: str, *, basin: str | None, target: str,
            missing_ok: bool) -> None:
    """A DELETE, retried as any request. A try whose outcome is unknown (cut off after it
    was sent) may have deleted the thing: a 404 (or "being deleted") after it says it
    did, not that it was missing."""
    may_have_landed = False

    def note(err: ServiceError) -> None:
        nonlocal may_have_landed
        may_have_landed = may_have_landed or (err.retryable and not err.unsent)

    try:
        transport.request("DELETE", path, basin=basin, target=target, on_retry=note)
    except S2NotFoundError:
        if not (missing_ok or may_have_landed):
            raise


def _basin_info(d: dict[str, Any]) -> BasinInfo:
    return BasinInfo(
        name=str(d["name"]),
        created_at=d.get("created_at"),
        deleted_at=d.get("deleted_at"),
        state=d.get("state"),
        # `location` (S2 now; s2 `api/src/v1/basin.rs`), or `scope` from older servers.
        location=d.get("location", d.get("scope")),
    )


def _stream_info(d: dict[str, Any]) -> StreamInfo:
    return StreamInfo(
        name=str(d["name"]),
        created_at=str(d.get("created_at", "")),
        deleted_at=d.get("deleted_at"),
        cipher=d.get("cipher"),
    )


class S2Client(Closeable):
    """Synchronous S2 client. Thread-safe; close it (or use `with`) to free connections."""

    def __init__(self, config: S2Config | None = None) -> None:
        self.config = config if config is not None else S2Config.from_env()
        self._transport = Transport(self.config)

    def __repr__(self) -> str:
        return f"S2Client({self.config!r})"

    def close(self) -> None:
        self._transport.close()

    # -- basins ---------------------------------------------------------------------------

    def basin(self, name: str) -> BasinClient:
        return BasinClient(self._transport, check_basin_name(name))

    def list_basins(self, prefix: str = "", start_after: str = "") -> Iterator[BasinInfo]:
        """Every basin whose name starts with `prefix`, following pagination."""
        after = start_after
        while True:
            params = {"prefix": prefix, "start_after": after, "limit": 1000}
            resp = self._transport.request(
                "GET", "/basins", basin=None, target="basin list", params=params
            )
            data = resp.json()
            items = data.get("basins", [])
            for item in items:
                yield _basin_info(item)
            if not data.get("has_more") or not items:
                return
            after = items[-1]["name"]

    def create_basin(self, name: str, config: dict[str, Any] | None = None) -> BasinInfo:
        """Create a basin; AlreadyExistsError if it exists. Retries are made idempotent
        with an S2 request token."""
        check_basin_name(name)
        body: dict[str, Any] = {"basin": name}
        if config:
            body["config"] = config
        resp = self._transport.request(
            "POST",
            "/basins",
            basin=None,
            target=f"basin {name!r}",
            json=body,
            headers={"s2-request-token": uuid.uuid4().hex},
        )
        return _basin_info(resp.json()) if resp.content else BasinInfo(name)

    def ensure_basin(self, name: str, config: dict[str, Any] | None = None) -> BasinInfo:
        """Make the basin exist with exactly `config` (PUT): created if missing; an
        existing basin's whole config is *replaced*, settings left out (all of them when
        `config` is None) going back to S2's defaults. To create a basin only when it is
        missing, use `create_basin` and catch `AlreadyExistsError`; to change single
        settings, reconfigure it."""
        check_basin_name(name)
        resp = self._transport.request(
            "PUT",
            f"/basins/{quote(name, safe='')}",
            basin=None,
            target=f"basin {name!r}",
            json={"config": config} if config else {},
        )
        return _basin_info(resp.json()) if resp.content else BasinInfo(name)

    def delete_basin(self, name: str, *, missing_ok: bool = False) -> None:
        check_basin_name(name)
        _delete(self._transport, f"/basins/{quote(name, safe='')}", basin=None,
                target=f"basin {name!r}", missing_ok=missing_ok)

    def get_basin_config(self, name: str) -> dict[str, Any]:
        check_basin_name(name)
        resp = self._transport.request(
            "GET", f"/basins/{quote(name, safe='')}", basin=None, target=f"basin {name!r}"
        )
        result: dict[str, Any] = resp.json()
        return result


class BasinClient:
    """Stream control plane of one basin, and a factory for StreamClients."""

    def __init__(self, transport: Transport, name: str) -> None:
        self._transport = transport
        self.name = name
        # Worked out once (the configuration is frozen): a writer asks once per stream.
        self._endpoint_url = transport.config.basin_base_url(name)[0]

    def __repr__(self) -> str:
        return f"BasinClient({self.name!r})"

    @property
    def endpoint_url(self) -> str:
        """The base URL this basin's requests go to."""
        return self._endpoint_url

    def stream(self, name: str) -> StreamClient:
        return StreamClient(self._transport, self.name, check_stream_name(name))

    def check_tails(self, names: Sequence[str]) -> dict[str, Position | None]:
        """Each stream's tail (None where it does not exist), the lookups sent together:
        for thousands of streams, a third of the client CPU of one thread each."""
        return _many.check_tails(self._basin(), names)

    def read_many(self, reads: Sequence[SmallRead], *, include_command_records: bool = True,
                  include_headers: bool = True) -> list[DecodedBatch | S2Error]:
        """Many unary reads sent together; each result is what `StreamClient.read` gives
        (a failed one is made again alone, with retries), or the error it ends with."""
        return _many.read_many(self._basin(), reads,
                               include_command_records=include_command_records,
                               include_headers=include_headers)

    def append_each(self, appends: Sequence[SingleAppend], *, in_flight: int = 64,
                    create_missing: bool = False) -> list[AppendAck | ServiceError]:
        """One append to each of many streams (pre-encoded batches, each under its own
        conditions), sent together, at most `in_flight` unanswered at a time. Each result
        is the ack or the error, never retried (an append cut short may have landed).
        `create_missing`: a missing stream is created and its append sent again at once,
        under the empty fencing token of a new stream."""
        return _many.append_each(self._basin(), appends, in_flight=in_flight,
                                 create_missing=create_missing)

    def append_bodies(self, streams: Sequence[str], bodies: Sequence[bytes],
                      condition_sizes: Sequence[int], *, in_flight: int = 64,
                      create_missing: bool = False) -> _many.BodyAcks:
        """`append_each` for whole AppendInput messages (body i to stream i, its fencing
        token condition the last `condition_sizes[i]` bytes), the acks read into ints
        (`_many.append_bodies`): a writer's first appends to thousands of streams."""
        return _many.append_bodies(self._basin(), streams, bodies, condition_sizes,
                                   in_flight=in_flight, create_missing=create_missing)

    def create_streams(self, names: Sequence[str]) -> None:
        """Create the streams of `names` that do not exist, the requests sent together."""
        _many.create_streams(self._basin(), names)

    def _basin(self) -> _many.Basin:
        return _many.Basin(self._transport, self.name, self.stream, self.create_stream)

    def watch_tails(self, **kw: Any) -> TailWatch:
        """A `TailWatch` over streams of this basin (close it when done)."""
        from ._watch import TailWatch

        return TailWatch(self._transport, self.name, **kw)

    def _target(self, stream: str | None = None) -> str:
        if stream is None:
            return f"basin {self.name!r}"
        return f"stream {stream!r} in basin {self.name!r}"

    def list_streams(self, prefix: str = "", start_after: str = "") -> Iterator[StreamInfo]:
        """Every stream whose name starts with `prefix`, following pagination."""
        after = start_after
        while True:
            params = {"prefix": prefix, "start_after": after, "limit": 1000}
            resp = self._transport.request(
                "GET",
                "/streams",
                basin=self.name,
                target=f"stream list of {self._target()}",
                params=params,
            )
            data = resp.json()
            items = data.get("streams", [])
            for item in items:
                yield _stream_info(item)
            if not data.get("has_more") or not items:
                return
            after = items[-1]["name"]

    def create_stream(self, name: str, config: StreamConfig | None = None) -> StreamInfo:
        """Create a stream; AlreadyExistsError if it exists."""
        check_stream_name(name)
        body: dict[str, Any] = {"stream": name}
        if config is not None:
            body["config"] = config.to_json()
        resp = self._transport.request(
            "POST",
            "/streams",
            basin=self.name,
            target=self._target(name),
            json=body,
            headers={"s2-request-token": uuid.uuid4().hex},
        )
        return _stream_info(resp.json()) if resp.content else StreamInfo(name, "")

    def ensure_stream(self, name: str, config: StreamConfig | None = None) -> StreamInfo:
        """Make the stream exist with exactly `config` (PUT): created if missing; an
        existing stream's whole config is *replaced*, settings left out (all of them when
        `config` is None) going back to the basin's defaults. Its records are kept. To
        create a stream only when it is missing, use `create_stream` and catch
        `AlreadyExistsError`."""
        check_stream_name(name)
        resp = self._transport.request(
            "PUT",
            f"/streams/{quote(name, safe='')}",
            basin=self.name,
            target=self._target(name),
            json=config.to_json() if config is not None else {},
        )
        return _stream_info(resp.json()) if resp.content else StreamInfo(name, "")

    def delete_stream(self, name: str, *, missing_ok: bool = False) -> None:
        check_stream_name(name)
        _delete(self._transport, f"/streams/{quote(name, safe='')}", basin=self.name,
                target=self._target(name), missing_ok=missing_ok)

    def get_stream_config(self, name: str) -> StreamConfig:
        check_stream_name(name)
        resp = self._transport.request(
            "GET",
            f"/streams/{quote(name, safe='')}",
            basin=self.name,
            target=self._target(name),
        )
        return StreamConfig.from_json(resp.json())
