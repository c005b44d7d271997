"""Handlers for basins and streams as resources: list, create, get, ensure, reconfigure,
delete. A handler's name is the kind its requests are counted under (`list_streams`, ...).

Creates answer 201 with `S2-Provision-Result` saying whether the resource was created
or an idempotent retry (`noop`), as s2-lite does; PUT (ensure) replaces an existing
resource's whole config (s2 `lite/src/backend/streams.rs`, `provision_stream`) and says
`created`, `updated` or `noop`. JSON bodies follow s2-lite's extractors (`api/src/data.rs`):
they need `Content-Type: application/json`, except PUT's, which is optional.
"""

from __future__ import annotations

from collections.abc import Callable

from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.names import (
    checked_name,
    stream_in_path,
    validate_basin_name,
    validate_basin_prefix,
    validate_stream_name,
    validate_stream_prefix,
)
from s2_spark.testing.semantics.store import Store
from s2_spark.testing.serving.asgi import Request, Send, query_int, respond, respond_json

__all__ = ["LIST_LIMIT", "BasinHandlers"]

LIST_LIMIT = 1000
MAX_REQUEST_TOKEN_BYTES = 36


def _list_params(req: Request, validate: Callable[[str, str], None]) -> tuple[str, str, int]:
    """A listing's prefix, cursor and limit, as s2-lite reads them (`ListItemsRequest`):
    a limit of 0 or over 1000 is 1000; a cursor before the prefix is allowed (the listing
    starts at the prefix); a prefix or cursor that no name could have is a 400
    `bad_query`."""
    limit = query_int(req, "limit")
    limit = LIST_LIMIT if limit is None or not 0 < limit <= LIST_LIMIT else limit
    prefix = req.query.get("prefix", "")
    start_after = req.query.get("start_after", "")
    for field, value in (("prefix", prefix), ("start_after", start_after)):
        try:
            validate(value, field.replace("_", "-"))
        except ApiError as e:
            raise ApiError.bad(
                "bad_query", f"Failed to deserialize query string: {field}: {e.body['message']}"
            ) from e
    return prefix, start_after, limit


def _page(names: list[str], prefix: str, start_after: str, limit: int) -> tuple[list[str], bool]:
    selected = [n for n in sorted(names) if n.startswith(prefix) and n > start_after]
    return selected[:limit], len(selected) > limit


def _request_token(req: Request) -> str | None:
    """`S2-Request-Token`: at most 36 bytes, else 400 `bad_header` (s2 `common/src/
    resources.rs`, `RequestToken`)."""
    value = req.header("s2-request-token")
    if value is not None and len(value.encode()) > MAX_REQUEST_TOKEN_BYTES:
        raise ApiError.bad(
            "bad_header",
            f"Invalid header `s2-request-token`: request token was longer than "
            f"{MAX_REQUEST_TOKEN_BYTES} bytes in length: {len(value.encode())}",
        )
    return value


class BasinHandlers:
    """The account's basins and each basin's streams, over a `Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- listing

    async def list_basins(self, req: Request, send: Send) -> None:
        prefix, start_after, limit = _list_params(req, validate_basin_prefix)
        names, more = _page(list(self.store.basins), prefix, start_after, limit)
        await respond_json(
            send,
            200,
            {"basins": [self.store.basins[n].info() for n in names], "has_more": more},
        )

    async def list_streams(self, req: Request, send: Send) -> None:
        basin_name = req.basin_name()
        prefix, start_after, limit = _list_params(req, validate_stream_prefix)
        basin = self.store.basin(basin_name)
        names, more = _page(list(basin.streams), prefix, start_after, limit)
        await respond_json(
            send,
            200,
            {"streams": [basin.streams[n].info() for n in names], "has_more": more},
        )

    # -- basins

    async def create_basin(self, req: Request, send: Send) -> None:
        body = await req.json()
        if not isinstance(body, dict) or not isinstance(body.get("basin"), str):
            raise ApiError.bad("bad_json", "request body must be an object with a `basin` name")
        checked_name(validate_basin_name, body["basin"], "bad_json", "basin")
        basin, created = self.store.create_basin(
            body["basin"], body.get("config"), request_token=_request_token(req)
        )
        # s2-lite answers 201 for an idempotent retry too; the header tells them apart.
        result = b"created" if created else b"noop"
        await respond_json(send, 201, basin.info(), [(b"s2-provision-result", result)])

    async def get_basin(self, req: Request, send: Send, name: str) -> None:
        await respond_json(send, 200, self.store.basin(name).config)

    async def ensure_basin(self, req: Request, send: Send, name: str) -> None:
        body = await req.json(optional=True)
        if body is not None and not isinstance(body, dict):
            raise ApiError.bad("bad_json", "request body must be a JSON object")
        basin, result = self.store.ensure_basin(name, (body or {}).get("config"))
        await respond_json(
            send,
            201 if result == "created" else 200,
            basin.info(),
            [(b"s2-provision-result", result.encode())],
        )

    async def reconfigure_basin(self, req: Request, send: Send, name: str) -> None:
        body = await req.json()
        await respond_json(send, 200, self.store.reconfigure_basin(name, body).config)

    async def delete_basin(self, req: Request, send: Send, name: str) -> None:
        self.store.delete_basin(name)
        await respond(send, 202)

    # -- streams

    async def create_stream(self, req: Request, send: Send) -> None:
        basin = req.basin_name()
        body = await req.json()
        if not isinstance(body, dict) or not isinstance(body.get("stream"), str):
            raise ApiError.bad("bad_json", "request body must be an object with a `stream` name")
        checked_name(validate_stream_name, body["stream"], "bad_json", "stream")
        stream, created = self.store.create_stream(
            basin, body["stream"], body.get("config"), request_token=_request_token(req)
        )
        result = b"created" if created else b"noop"
        await respond_json(send, 201, stream.info(), [(b"s2-provision-result", result)])

    async def get_stream(self, req: Request, send: Send, name: str) -> None:
        stream = self.store.stream(req.basin_name(), stream_in_path(name))
        await respond_json(send, 200, stream.config)

    async def ensure_stream(self, req: Request, send: Send, name: str) -> None:
        basin = req.basin_name()
        name = stream_in_path(name)
        body = await req.json(optional=True)
        if body is not None and not isinstance(body, dict):
            raise ApiError.bad("bad_json", "request body must be a JSON object")
        # The PUT body is the StreamConfig itself; without one (no Content-Type, or an
        # empty body) the stream gets the basin's defaults, replacing what it had.
        stream, result = self.store.ensure_stream(basin, name, body)
        await respond_json(
            send,
            201 if result == "created" else 200,
            stream.info(),
            [(b"s2-provision-result", result.encode())],
        )

    async def reconfigure_stream(self, req: Request, send: Send, name: str) -> None:
        basin = req.basin_name()
        name = stream_in_path(name)
        body = await req.json()
        stream = self.store.reconfigure_stream(basin, name, body)
        await respond_json(send, 200, stream.config)

    async def delete_stream(self, req: Request, send: Send, name: str) -> None:
        self.store.delete_stream(req.basin_name(), stream_in_path(name))
        await respond(send, 202)
