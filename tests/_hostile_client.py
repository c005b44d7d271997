"""The client side of `test_hostile_servers`: one client path of this project, run in a
process of its own against a server that misbehaves, so its memory can be measured alone.

    python tests/_hostile_client.py PATH URL

Prints `ready` once the client is made and its baseline taken; a path that runs until
stopped (a watch) then waits for a line on stdin. Last, one line of JSON: `outcome`
(`carried-on`, or the type and text of the error the path ended with), `baseline` (VmRSS
before the path ran, KiB) and `peak` (VmHWM after it, reset at the baseline, KiB).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from s2_spark.durable import DurableConfig, DurableStreamsClient
from s2_spark.retry import RetryPolicy
from s2_spark.s2 import S2Client, S2Config, SmallRead

#: Retries end soon: a watch's test needs one failure, not a client that tries for 2
#: minutes. A call that hits a limit is never retried (the tests count its requests).
RETRY = RetryPolicy(timeout=3.0, initial_backoff=0.05, max_backoff=0.5)


def _status(field: str) -> int:
    """A VmRSS / VmHWM figure of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _until_stopped() -> dict[str, Any]:
    sys.stdin.readline()
    return {"outcome": "carried-on"}


def _s2(url: str) -> S2Client:
    return S2Client(S2Config(endpoint=url, retry=RETRY, compression="none"))


def s2_watch(url: str) -> Callable[[], dict[str, Any]]:
    """The tail watch of one S2 stream: it polls until stopped, whatever the answers."""
    client = _s2(url)
    watch = client.basin("hostile-basin").watch_tails()

    def run() -> dict[str, Any]:
        watch.watch({"stream": 0})
        return _until_stopped()
    return run


def s2_check_tails(url: str) -> Callable[[], dict[str, Any]]:
    """A tail lookup of 64 streams at once (the fan-out: as many in flight)."""
    client = _s2(url)
    basin = client.basin("hostile-basin")
    return lambda: {"outcome": basin.check_tails([f"s{i}" for i in range(64)])}


def s2_append_bodies(url: str) -> Callable[[], dict[str, Any]]:
    """A writer's first appends to 64 streams at once, in bulk (`append_bodies`): the
    outcome is the first append's error (each append's is returned, not raised)."""
    client = _s2(url)
    basin = client.basin("hostile-basin")
    body = b"\x0a\x03\x12\x01x"  # an AppendInput of one record

    def run() -> dict[str, Any]:
        acks = basin.append_bodies([f"s{i}" for i in range(64)], [body] * 64, [0] * 64,
                                   in_flight=64)
        first = acks.others[0]
        return {"outcome": {"type": type(first).__name__, "text": str(first)},
                "failed": len(acks.others)}
    return run


def s2_read_many(url: str) -> Callable[[], dict[str, Any]]:
    """Small reads of 16 streams at once, in bulk (`read_many`): the outcome is the first
    read's error (each read's is returned, not raised). 16: each takes `MAX_BODY_BYTES`
    before it fails, and 64 of those are the hostile server's cap."""
    client = _s2(url)
    basin = client.basin("hostile-basin")

    def run() -> dict[str, Any]:
        got = basin.read_many([SmallRead(f"s{i}", 0, 1) for i in range(16)])
        first = got[0]
        return {"outcome": {"type": type(first).__name__, "text": str(first)},
                "failed": sum(isinstance(g, Exception) for g in got)}
    return run


def s2_list_basins(url: str) -> Callable[[], dict[str, Any]]:
    """A control-plane call, unary."""
    client = _s2(url)
    return lambda: {"outcome": [b.name for b in client.list_basins()]}


def durable_sse(url: str) -> Callable[[], dict[str, Any]]:
    """A Durable Streams read with live SSE, its limit at 1 MiB."""
    client = DurableStreamsClient(DurableConfig(base_url=url, retry=RETRY,
                                                max_read_bytes=1 << 20))
    return lambda: {"outcome": len(list(client.stream("s").read("-1", live="sse")))}


def durable_get(url: str) -> Callable[[], dict[str, Any]]:
    """A Durable Streams catch-up read of one answer, its limit at 1 MiB."""
    client = DurableStreamsClient(DurableConfig(base_url=url, retry=RETRY,
                                                max_read_bytes=1 << 20))
    return lambda: {"outcome": len(client.stream("s").get("-1").data)}


def durable_read(url: str) -> Callable[[], dict[str, Any]]:
    """A Durable Streams catch-up read as it arrives, its limit at 1 MiB."""
    client = DurableStreamsClient(DurableConfig(base_url=url, retry=RETRY,
                                                max_read_bytes=1 << 20))
    return lambda: {"outcome": len(list(client.stream("s").read("-1")))}


def durable_watch(url: str) -> Callable[[], dict[str, Any]]:
    """The tail watch of one Durable Streams stream: polls until stopped."""
    client = DurableStreamsClient(DurableConfig(base_url=url, retry=RETRY))
    watch = client.watch_tails()

    def run() -> dict[str, Any]:
        watch.watch({f"{url}/s": {"offset": "0", "skip": 0}})
        return _until_stopped()
    return run


def hold_32_mib(url: str) -> Callable[[], dict[str, Any]]:
    """No client: 32 MiB held, to show what the measure sees."""
    return lambda: {"outcome": len(b"x" * (32 << 20))}


PATHS = {f.__name__: f for f in (s2_watch, s2_check_tails, s2_append_bodies, s2_read_many,
                                 s2_list_basins,
                                 durable_sse, durable_get, durable_read, durable_watch,
                                 hold_32_mib)}


def main(path: str, url: str) -> None:
    run = PATHS[path](url)
    baseline = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on
    print("ready", flush=True)
    try:
        result = run()
    except Exception as exc:
        result = {"outcome": {"type": type(exc).__name__, "text": str(exc)}}
    print(json.dumps({**result, "baseline": baseline, "peak": _status("VmHWM")}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
