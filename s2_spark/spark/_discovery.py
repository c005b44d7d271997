"""Which selected streams exist, listed again on a cadence without holding up plans.

A prefix of 10,000 streams takes ten pages to list (about 0.15 s against the local server,
more over a real network); listing it inside every busy plan made one plan in every
`discoveryIntervalMs` that much slower. So a busy plan takes the last listing and, when
it is older than the interval, starts the next one in a thread; a listing that failed is
raised at the next plan. Listings also keep to a twentieth of the time at most (the next
waits at least 20 times as long as the last took): a listing costs the service and the
driver in proportion to the streams, and a new stream is read from its beginning when it
is found, so finding it a little later loses nothing. A plan that needs the streams as
they are now (the first, or one that would otherwise report nothing new) lists them
itself, while a listing is short (`QUICK_LISTING`: up to two pages); a longer one (25,000
streams are 25 pages, seconds against a busy server) it leaves to the background, on the
same cadence, so idle plans over many streams do not each list them all. (Counted in
streams, not seconds: what a plan does must not depend on the machine's load.)

Driver only; no protocol here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["LISTING_SHARE", "QUICK_LISTING", "Discovery"]

#: A listing waits at least this many times as long as the last one took.
LISTING_SHARE = 20
#: Streams the last listing found at most for a plan to list itself (`now_if_quick`).
QUICK_LISTING = 2000

log = logging.getLogger("s2_spark.spark")


class Discovery:
    """The streams `list_streams()` names, listed again every `interval` seconds (or
    `LISTING_SHARE` times the last listing's duration, if longer)."""

    def __init__(self, list_streams: Callable[[], list[str]], interval: float) -> None:
        self._list = list_streams
        self._interval = interval
        self._lock = threading.Lock()
        self._last: tuple[float, list[str]] | None = None  # (when the listing began, names)
        self._gap = interval  # seconds from one listing to the next, at least
        self._error: BaseException | None = None
        self._refreshing = False
        self._handed: float | None = None  # (plan thread) see `handed_at`

    @property
    def handed_at(self) -> float | None:
        """When the listing last handed to a plan began (time.monotonic), or None. Not
        the last one made: a listing the background finished while a plan went on is not
        the one that plan planned from."""
        return self._handed

    def now(self) -> list[str]:
        """A listing made now, for the plan asking."""
        began, names = self._make()
        self._handed = began
        return names

    def _make(self) -> tuple[float, list[str]]:
        """List the streams; kept as the last listing unless a later-begun one is."""
        began = time.monotonic()
        names = self._list()
        took = time.monotonic() - began
        with self._lock:
            self._gap = max(self._interval, LISTING_SHARE * took)
            if self._last is None or self._last[0] <= began:
                self._last = (began, names)
        return began, names

    def now_if_quick(self) -> list[str] | None:
        """A listing made now, if the last one found at most `QUICK_LISTING` streams; else
        None: the next is made in the background when it is due (`recent`)."""
        last = self._last
        return self.now() if last is None or len(last[1]) <= QUICK_LISTING else None

    def recent(self) -> list[str]:
        """The last listing (made now if there is none); one older than the interval is
        refreshed in the background for later plans."""
        with self._lock:
            error, self._error = self._error, None
            last = self._last
            stale = last is not None and time.monotonic() - last[0] >= self._gap
            start = stale and not self._refreshing
            self._refreshing = self._refreshing or start
        if error is not None:
            raise error
        if last is None:
            return self.now()
        if start:
            threading.Thread(target=self._refresh, name="s2-spark-discovery",
                             daemon=True).start()
        self._handed = last[0]
        return last[1]

    def _refresh(self) -> None:
        try:
            self._make()
        except Exception as exc:  # raised by the next plan, which the query reports
            log.debug("listing the streams failed: %s", type(exc).__name__)
            with self._lock:
                self._error = exc
        finally:
            with self._lock:
                self._refreshing = False
