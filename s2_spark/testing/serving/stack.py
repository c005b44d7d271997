"""Which HTTP stack serves the local server: granian where it is installed (the `server`
extra), else hypercorn; or the one asked for by name (`stack=`, `--http-stack`), for
comparing them. The choice is said in the log (`s2_spark.testing.server`, INFO).

A stack serves the ASGI app (`semantics.app.S2App`, and any ASGI middleware around it)
on a listening socket, on the running event loop, until an event is set::

    serve = choose("auto")
    await serve(sock, app, shutdown_event, tls)
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from s2_spark.testing.serving import granian_stack, hypercorn_stack
from s2_spark.testing.serving.endpoint import ServerTls

__all__ = ["STACKS", "Serve", "choose"]

Serve = Callable[[socket.socket, Any, asyncio.Event, "ServerTls | None"], Awaitable[None]]

#: The stacks by name, fastest first: `auto` takes the first one available.
STACKS = {"granian": granian_stack, "hypercorn": hypercorn_stack}

_log = logging.getLogger("s2_spark.testing.server")


def choose(name: str = "auto") -> tuple[str, Serve]:
    """(name, serve function) of the stack `name` (`auto`, `granian`, `hypercorn`).

    `auto` takes granian when it can run here, else hypercorn, and logs which and why;
    a stack asked for by name that cannot run is an error naming what is missing."""
    if name != "auto" and name not in STACKS:
        raise ValueError(f"unknown HTTP stack {name!r}: use auto, {', '.join(STACKS)}")
    reasons: list[str] = []
    for candidate, module in STACKS.items():
        if name not in ("auto", candidate):
            continue
        why_not = module.available()
        if why_not is None:
            if reasons:
                _log.warning("local S2 server on %s: %s", candidate, "; ".join(reasons))
            else:
                _log.info("local S2 server on %s", candidate)
            return candidate, module.serve
        if name != "auto":
            raise RuntimeError(f"HTTP stack {name!r} cannot run here: {why_not}")
        reasons.append(why_not)
    raise RuntimeError("no HTTP stack for the local S2 server: " + "; ".join(reasons)
                       + " (pip install 's2-spark[server]')")
