"""Which S2 server a benchmark runs against: `--server local|s2-lite|URL`.

* `local` (the default): our local S2 server, `s2_spark.testing.ServerProcess`, a child
  process started for the run;
* `s2-lite`: S2's own server (a Rust binary, `s2_spark.testing.external.S2Lite`), in
  memory on a free port, started for the run (built with cargo into the cache on first
  use; `python -m s2_spark.testing.external build s2-lite` builds it ahead);
* a URL (`http://127.0.0.1:8080`): any S2 endpoint already running, e.g. an s2-lite you
  started. It is neither started, pinned nor measured here: its CPU shows as absent, and
  the placement keeps the server's CPU free for it (pin it there yourself, `taskset`).

Both servers started here are pinned the same way (`Placement.pin_server`) and measured
the same way (`CpuMeter(server=server.pid)`). What only the local server has, its
counters over `GET /_local/stats`, is `None` from any other (`request_counts`,
`append_counts`; `no_counts` says so in a printable form)::

    ap = argparse.ArgumentParser()
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args()
    placement = placed(args)
    with s2_server(args, placement) as server:  # started, pinned, `server: ...` printed
        cpu = CpuMeter(server=server.pid)
        ...  # server.url
    print(f"bench: ... ({server.mode})")  # `pinned`, or `pinned, s2-lite`, ...
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from _pinning import Placement

__all__ = ["S2Server", "add_server_option", "is_url", "s2_server"]

KINDS = ("local", "s2-lite")


def is_url(choice: str) -> bool:
    return choice.startswith(("http://", "https://"))


def _choice(text: str) -> str:
    if text in KINDS or is_url(text):
        return text.rstrip("/")
    raise argparse.ArgumentTypeError(
        f"{text!r}: give local, s2-lite or the URL of a running S2 server (http://...)")


def add_server_option(parser: argparse.ArgumentParser) -> None:
    """`--server local|s2-lite|URL` (default `local`)."""
    parser.add_argument(
        "--server", type=_choice, default="local", metavar="{local,s2-lite,URL}",
        help="the S2 server: local (our local server, default), s2-lite (S2's own server, "
             "started here and pinned like the local one), or the URL of one already "
             "running (not started, pinned or measured here)")


@dataclass
class S2Server:
    """The server a benchmark runs against: `url`, `pid` (None: not started here), `name`
    for printed lines, `kind` (`local`, `s2-lite` or `url`)."""

    kind: str
    name: str
    url: str
    pid: int | None
    placement: Placement
    _local: Any = None  # the ServerProcess, for `local`
    _stats: bool = False  # whether `GET /_local/stats` answers
    notes: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        """For a benchmark's last line: `pinned` / `unpinned` against the local server (as
        before this option), with the server's kind after it otherwise."""
        if self.kind == "local":
            return self.placement.mode
        if self.kind == "s2-lite":
            return f"{self.placement.mode}, s2-lite"
        return f"{self.placement.mode}, a running server not pinned here"

    @property
    def no_counts(self) -> str:
        """What to print instead of a figure from the local server's counters."""
        return f"n/a ({self.name} has no request counts)"

    @property
    def has_counts(self) -> bool:
        return self._stats

    def request_counts(self, *, timeout: float = 10.0) -> dict[str, int] | None:
        """Requests by kind since the server started (`GET /_local/stats`); None from a
        server without those counters (s2-lite, S2)."""
        if not self._stats:
            return None
        if self._local is not None:
            return dict(self._local.request_counts(timeout=timeout))
        from s2_spark.testing.serving.server import fetch_request_counts

        return fetch_request_counts(self.url, timeout=timeout)

    def append_counts(self, *, timeout: float = 10.0) -> dict[str, int] | None:
        """Appends by outcome (`landed`, `refused`), as `request_counts`; None also from a
        local server of a release without them."""
        if not self._stats:
            return None
        if self._local is not None:
            counts = getattr(self._local, "append_counts", None)
            return None if counts is None else dict(counts(timeout=timeout))
        from s2_spark.testing.serving.server import fetch_append_counts

        return fetch_append_counts(self.url, timeout=timeout)

    def describe(self) -> str:
        if self.pid is None:
            where = ("already running: not started, pinned or measured here; pin it to "
                     f"CPU {_cpus(self.placement.server_cpus)} yourself to match"
                     if self.placement.pinned else "already running: not started here")
        elif self.placement.pinned:
            where = f"pid {self.pid}, pinned to CPU {_cpus(self.placement.server_cpus)}"
        else:
            where = f"pid {self.pid}, unpinned"
        counts = "" if self._stats else "; no request counts"
        notes = "".join(f"; {n}" for n in self.notes)
        at = "" if self.kind == "url" else f" at {self.url}"
        return f"server: {self.name}{at} ({where}{counts}{notes})"


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _answers_stats(url: str) -> bool:
    """Whether the server at `url` has the local server's counters."""
    try:
        from s2_spark.testing.serving.server import fetch_request_counts

        fetch_request_counts(url, timeout=5.0)
    except Exception:
        return False
    return True


@contextlib.contextmanager
def s2_server(args: argparse.Namespace, placement: Placement, *, lite_root: str | None = None,
              **local: Any) -> Iterator[S2Server]:
    """The server `args.server` names, running, its process pinned by `placement`, a
    `server: ...` line printed. `local`: `ServerProcess` settings (`heartbeat_interval`,
    `stack`, ...); with another server they do not apply: `stack` other than `auto`
    exits with a message, the rest are named in the `server:` line as not applied.
    `lite_root`: s2-lite keeps its streams in this folder (`--local-root`), not in memory."""
    choice = getattr(args, "server", "local")
    if choice == "local":
        from s2_spark.testing import ServerProcess

        with ServerProcess(**local) as proc:
            server = S2Server("local", "local server", proc.url, proc.pid, placement, _local=proc,
                              _stats=hasattr(proc, "request_counts"))
            yield _started(server)
        return
    stack = local.pop("stack", "auto")
    if stack != "auto":
        raise SystemExit(f"--http-stack {stack} is the local server's; it does not apply to "
                         f"--server {choice}")
    ignored = [f"{k}={v!r} not applied (the local server's)" for k, v in local.items()]
    if choice == "s2-lite":
        from s2_spark.testing.external import S2_LITE, S2Lite

        lite = S2Lite(local_root=lite_root)
        name = "s2-lite" if lite.binary is not None else f"s2-lite {S2_LITE.version}"
        if lite.binary is None and not S2_LITE.path.is_file():
            print(f"building {name} into {S2_LITE.folder} first (once; tens of minutes)",
                  flush=True)
        with lite:
            on_disk = [] if lite_root is None else [f"streams on disk in {lite_root}"]
            yield _started(S2Server("s2-lite", name, lite.url, lite.pid, placement,
                                    notes=on_disk + ignored))
        return
    yield _started(S2Server("url", choice, choice, None, placement,
                            _stats=_answers_stats(choice), notes=ignored))


def _started(server: S2Server) -> S2Server:
    server.placement.pin_server(server.pid)
    print(server.describe(), flush=True)
    return server
