"""The local S2 server's ASGI application: authorization, routing and request counts.

One `/v1` endpoint serves account and basin operations; the basin comes from the
`S2-Basin` header, as in s2-lite. Unary calls speak JSON or protobuf; reads also speak
SSE and S2S; appends also run as S2S sessions (full duplex on HTTP/2). The handlers are
grouped by resource (`handlers_basins`, `handlers_appends`, `handlers_reads`), the
plumbing is in `serving.asgi`, the body shapes in `codecs`.

Not S2: the app counts the requests it receives per kind (counted on arrival; kinds are the
handler names, e.g. `check_tail`, `read`, `read_session`, `append_session`,
`list_streams`) and the appends it took by outcome (`landed`, `refused`: a 412), and
answers them as JSON at `GET /_local/stats`, a testing-only path outside `/v1` that no S2
client calls (it needs the access token when one is set and is not counted itself). Tests
and benchmarks use it to see how many requests a client made. Also testing only: a test
may arm S2 errors for the next requests of a kind (`serving.faults`: in process, or over
`POST /_local/faults`).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.handlers_appends import AppendHandlers
from s2_spark.testing.semantics.handlers_basins import BasinHandlers
from s2_spark.testing.semantics.handlers_reads import ReadHandlers
from s2_spark.testing.semantics.names import checked_name, validate_basin_name
from s2_spark.testing.semantics.read import HEARTBEAT_INTERVAL, HeartbeatInterval, heartbeat_range
from s2_spark.testing.semantics.store import Store
from s2_spark.testing.serving.asgi import (
    Receive,
    Request,
    Scope,
    Send,
    closing,
    respond,
    respond_json,
)
from s2_spark.testing.serving.counter import KindCounter
from s2_spark.testing.serving.faults import FAULTS_PATH, Faults, answer_fault, swallowed

__all__ = ["FAULTS_PATH", "STATS_PATH", "UNROUTED", "S2App"]

#: The testing-only path answering the request counts (not part of S2's API).
STATS_PATH = "/_local/stats"
#: The kind of requests answered before reaching a handler: failed authorization, unknown
#: routes, 501s, a bad basin name in the path, a path that is not UTF-8.
UNROUTED = "unrouted"

Handler = Callable[..., Awaitable[None]]


def _records_kind(req: Request, base: str) -> str:
    """`read` / `append` refined by format: S2S sessions and SSE are kinds of their own,
    and so is a unary read that long-polls (`wait` > 0), the way a tail watch asks."""
    s2s = req.mime("content-type") == "s2s/proto" or (
        base == "read" and req.mime("accept") == "s2s/proto"
    )
    if s2s:
        return f"{base}_session"
    if base == "read" and req.mime("accept") == "text/event-stream":
        return "read_sse"
    if base == "read" and req.query.get("wait", "0") not in ("", "0"):
        return "read_wait"
    return base


def _shape(rest: list[str]) -> str | None:
    """The shape of a path below `/v1/{resource}`, its name replaced by `{name}`."""
    if not rest:
        return ""
    if len(rest) == 1:
        return "{name}"
    if rest[1:] == ["records"]:
        return "{name}/records"
    if rest[1:] == ["records", "tail"]:
        return "{name}/records/tail"
    return None


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class S2App:
    """ASGI app over a `Store`. Token comparison is constant-time; tokens are never logged."""

    def __init__(
        self,
        store: Store,
        *,
        token: str | None = None,
        heartbeat_interval: float | HeartbeatInterval = HEARTBEAT_INTERVAL,
    ) -> None:
        self.store = store
        self._token = token
        self.requests = KindCounter()
        self.faults = Faults()  # testing only: errors a test armed (`serving.faults`)
        self.basins = BasinHandlers(store)
        self.appends = AppendHandlers(store, KindCounter())
        self.reads = ReadHandlers(store, heartbeat_range(heartbeat_interval))
        self._routes = self._route_table()
        self._started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._started:  # on the server's loop: replayed deletions' removals wait
            self._started = True
            self.store.removals.start()
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return
        started = False
        req: Request | None = None

        async def tracking_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if req is not None and req.unread:
                    # A body left unread (too large, or not used and long): close, as
                    # s2-lite's hyper does, rather than read it on, maybe forever.
                    headers = [*message.get("headers", ()), *closing(scope)]
                    message = {**message, "headers": headers}
            await send(message)

        def count_unrouted() -> None:
            # Before answering, so a client that has its answer sees the count.
            if req is None or not req.counted:
                self.requests.add(UNROUTED)

        try:
            req = Request(scope, receive)
            self._authorize(req)
            await self._route(req, tracking_send)
        except ApiError as e:
            count_unrouted()
            if not started and e.empty_body:
                await respond(tracking_send, e.status)
            elif not started:
                await respond_json(tracking_send, e.status, e.body)
        except UnicodeDecodeError:
            count_unrouted()
            if not started:
                await respond_json(
                    send, 400, {"code": "bad_path", "message": "path is not valid UTF-8"}
                )
        except (ConnectionError, asyncio.CancelledError):
            count_unrouted()
            raise
        except Exception as e:  # pragma: no cover - a bug; answer 500 rather than hang
            count_unrouted()
            if not started:
                await respond_json(
                    send, 500, {"code": "other", "message": f"{type(e).__name__}: {e}"}
                )
            raise

    def _authorize(self, req: Request) -> None:
        if self._token is None:
            return
        auth = req.header("authorization")
        if auth is None:
            raise ApiError.standard(401, "authn", "missing access token")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise ApiError.standard(401, "authn", "malformed Authorization header")
        if not hmac.compare_digest(value.strip().encode(), self._token.encode()):
            raise ApiError.standard(403, "permission_denied", "invalid access token")

    async def _dispatch(self, handler: Handler, req: Request, send: Send, *args: str) -> None:
        """Count the request under its handler's name (refined by format), then run it."""
        kind = handler.__name__
        if kind in ("read", "append"):
            kind = _records_kind(req, kind)
        self.requests.add(kind)
        req.counted = True
        stream = args[0] if args and req.segments[1] == "streams" else None
        fault = self.faults.take(kind, req.header("s2-basin"), stream)
        if fault is None:
            await handler(req, send, *args)
            return
        if fault.landed:
            await handler(req, swallowed, *args)
        await answer_fault(fault, send)

    async def _arm_fault(self, req: Request, send: Send) -> None:
        """`POST /_local/faults`: arm a fault (`serving.faults`). Testing only, not S2."""
        req.counted = True
        spec = await req.json()
        try:
            self.faults.arm_json(spec if isinstance(spec, dict) else {})
        except (TypeError, ValueError) as e:
            raise ApiError.bad("bad_json", f"not a fault: {e}") from e
        await respond_json(send, 201, spec)

    async def _stats(self, req: Request, send: Send) -> None:
        """`GET /_local/stats`: {"requests": {kind: count}, "appends": {outcome: count}}.
        Testing only, not S2."""
        req.counted = True  # not counted: reading the counts leaves them as they were
        await respond_json(send, 200, {"requests": self.requests.snapshot(),
                                       "appends": self.appends.outcomes.snapshot()})

    async def _route(self, req: Request, send: Send) -> None:
        seg = req.segments
        m = req.method
        if seg == ["_local", "stats"] and m == "GET":
            return await self._stats(req, send)
        if seg == ["_local", "faults"] and m == "POST":
            return await self._arm_fault(req, send)
        if seg in (["health"], ["ping"]) and m == "GET":
            # s2-lite's health check (`lite/src/handlers/mod.rs`, `health`); not counted.
            req.counted = True
            return await respond(send, 200, b"OK", [(b"content-type", b"text/plain")])
        if len(seg) < 2 or seg[0] != "v1":
            raise ApiError.empty(404)  # axum: no route, no body
        kind, rest = seg[1], seg[2:]
        if kind in ("access-tokens", "metrics", "locations"):
            # s2-lite answers these with 501 too.
            raise ApiError.standard(501, "not_implemented", "Not implemented")
        by_method = self._routes.get((kind, _shape(rest)))
        if by_method is None:
            raise ApiError.empty(404)
        handler = by_method.get(m)
        if handler is None:
            raise ApiError.empty(405)  # axum: a route without this method
        if kind == "basins" and len(rest) == 1:
            checked_name(validate_basin_name, rest[0], "bad_path", "basin")
        await self._dispatch(handler, req, send, *rest[:1])

    def _route_table(self) -> dict[tuple[str, str | None], dict[str, Handler]]:
        """(resource, path shape) -> method -> handler; the name in a path is its argument."""
        b, r, a = self.basins, self.reads, self.appends
        return {
            ("basins", ""): {"GET": b.list_basins, "POST": b.create_basin},
            ("basins", "{name}"): {
                "GET": b.get_basin,
                "PUT": b.ensure_basin,
                "DELETE": b.delete_basin,
                "PATCH": b.reconfigure_basin,
            },
            ("streams", ""): {"GET": b.list_streams, "POST": b.create_stream},
            ("streams", "{name}"): {
                "GET": b.get_stream,
                "PUT": b.ensure_stream,
                "DELETE": b.delete_stream,
                "PATCH": b.reconfigure_stream,
            },
            ("streams", "{name}/records"): {"GET": r.read, "POST": a.append},
            ("streams", "{name}/records/tail"): {"GET": r.check_tail},
        }
