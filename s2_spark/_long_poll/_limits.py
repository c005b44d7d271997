"""How many streams a watch may long-poll over HTTP/1.1: one connection, so one open file,
each, within the process's open-files limit (raised first, as Go's runtime does)."""

from __future__ import annotations

import logging
import threading

try:
    import resource
except ImportError:  # Windows: no open-files limit of this kind
    resource = None  # type: ignore[assignment]

__all__ = ["FD_RESERVE", "raise_open_files_limit", "watch_limit"]

log = logging.getLogger("s2_spark.watch")

#: Open files a process keeps for everything but the watch's connections (the protocol
#: clients' pools, Spark's own sockets and files); see `watch_limit`.
FD_RESERVE = 1024

#: Where there are no such limits (Windows, no `resource` module), what bounds a process's
#: outbound connections to one host is its ephemeral ports: 16,384 by default.
NO_RLIMIT_CONNECTIONS = 16384


def watch_limit() -> int:
    """Streams a watch may long-poll at once over HTTP/1.1: one connection each, within
    the process's open-files limit (its soft limit raised to the hard one first) less
    `FD_RESERVE`."""
    soft = raise_open_files_limit()
    return max(0, soft - FD_RESERVE)


_RAISED = threading.Lock()


def raise_open_files_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit, as Go's runtime
    does for every program (the soft default, often 1024, dates from `select`); return
    the soft limit now in force. A process whose limit cannot be raised keeps it. Where
    there is no such limit (Windows), `NO_RLIMIT_CONNECTIONS`."""
    if resource is None:
        return NO_RLIMIT_CONNECTIONS
    with _RAISED:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return 1 << 30
        # An unlimited hard limit (macOS) still caps the soft one at the system's own.
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        if soft >= target:
            return soft
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.info("the open-files limit stays at %d (raising it to %d failed: %s)",
                     soft, target, exc)
            return soft
        log.info("raised the open-files soft limit from %d to %d for the tail watch",
                 soft, target)
        return target
