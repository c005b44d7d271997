"""Deleting streams and basins the way s2-lite does: first *deletion pending*, then gone.

s2-lite (`lite/src/backend/streams.rs`, `basins.rs`, `core.rs`, `streamer.rs`, `bgtasks/`):

* Deleting a stream appends a terminal trim (a `trim` command record to seq_num 2^64-1,
  timestamp 2^64-1 as the client's) and marks the stream `deleted_at`. Sessions that
  follow it get that record, then end with 503 `unavailable` ("streamer missing in
  action"): its streamer is gone. An append session's next input is answered the same.
* While deletion is pending, every new request naming the stream (read, check tail,
  append, create, ensure, reconfigure, get config) answers 409 `stream_deletion_pending`;
  a listing shows it with `deleted_at`; deleting it again is accepted and changes nothing.
* A background task then removes it: from then on it is not found (404), and its name is
  free. In s2-lite that runs as soon as the terminal trim is durable (milliseconds); here
  after `Removals.delay` seconds (0 by default), so tests can watch the pending state.
* Deleting a basin marks it `deleted_at` (creating, ensuring or reconfiguring it, and
  creating streams in it, answer 409 `basin_deletion_pending`), deletes each of its
  streams as above, and removes the basin once they are gone. (s2-lite removes it at its
  basin-deletion task's next tick, every 60 s, once its streams are gone.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from s2_spark.testing.semantics.append_rules import AppendRecord
from s2_spark.testing.semantics.errors import ApiError

__all__ = [
    "MAX_U64",
    "TERMINAL_TRIM",
    "Removals",
    "basin_deletion_pending",
    "stream_deletion_pending",
    "streamer_gone",
]

MAX_U64 = 2**64 - 1
#: The record a deletion appends (s2-lite `terminal_trim_input`): trim everything.
TERMINAL_TRIM: AppendRecord = (MAX_U64, [(b"", b"trim")], MAX_U64.to_bytes(8, "big"))


def stream_deletion_pending() -> ApiError:
    """409 for a new request naming a stream whose deletion is pending."""
    return ApiError.standard(409, "stream_deletion_pending", "stream deletion pending")


def basin_deletion_pending(basin: str) -> ApiError:
    """409 for creating in, or changing, a basin whose deletion is pending."""
    return ApiError.standard(409, "basin_deletion_pending", f"basin `{basin}` is being deleted")


def streamer_gone() -> ApiError:
    """503 for a session that still follows, or appends to, a deleted stream."""
    return ApiError.standard(503, "unavailable", "streamer missing in action")


class Removals:
    """Runs each removal `delay` seconds after it is asked for, on the server's event
    loop (s2-lite's background tasks). Asked for outside a running loop (deletions
    pending in a replayed journal), it waits for `start`."""

    def __init__(self, delay: float = 0.0) -> None:
        if not delay >= 0:
            raise ValueError(f"deletion delay must be a number of seconds >= 0 (got {delay!r})")
        self.delay = delay
        self._waiting: list[Callable[[], None]] = []

    def later(self, remove: Callable[[], None]) -> None:
        """Run `remove` after the delay."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._waiting.append(remove)
            return
        loop.call_later(self.delay, remove)

    def start(self) -> None:
        """(On the server's loop) schedule the removals asked for before it ran."""
        waiting, self._waiting = self._waiting, []
        for remove in waiting:
            self.later(remove)
