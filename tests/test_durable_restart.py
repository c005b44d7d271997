"""A file-backed reference server killed (SIGKILL) and restarted under a reader.

Readers retry with backoff and resume from the last delivered offset, so across the
restart every message arrives exactly once: killed between catch-up chunks, while a
long-poll is pending, and under an SSE connection (which resumes from the last control
event's offset).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from durable_testbed import DurableServer

from s2_spark.durable import DurableConfig, DurableStreamsClient, ReadChunk, RetryPolicy

PATIENT = RetryPolicy(max_attempts=40, initial_backoff=0.05, max_backoff=0.5)
DEADLINE = 30.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DurableServer]:
    with DurableServer(data_dir=tmp_path / "data", long_poll_timeout=0.5) as s:
        yield s


def restart(server: DurableServer) -> None:
    server.kill()
    server.start()


class Tail:
    """Runs a reader in a thread; `chunks` receives every chunk it yields."""

    def __init__(self, client: DurableStreamsClient, path: str, live: Any) -> None:
        self.chunks: queue.Queue[ReadChunk | BaseException] = queue.Queue()
        self.reader = client.stream(path, content_type="application/json").read("-1", live=live)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for chunk in self.reader:
                self.chunks.put(chunk)
        except BaseException as exc:
            self.chunks.put(exc)

    def until(self, wanted: list[Any], got: list[Any]) -> ReadChunk:
        """Collect messages into `got` until it holds `wanted`; return the last chunk."""
        while True:
            item = self.chunks.get(timeout=DEADLINE)
            if isinstance(item, BaseException):
                raise item
            got += item.messages()
            assert got == wanted[: len(got)], "a message was lost, repeated or reordered"
            if len(got) >= len(wanted) and item.up_to_date:
                return item


@pytest.mark.parametrize("live", ["long-poll", "sse"])
def test_reader_survives_server_restarts(server: DurableServer, live: str) -> None:
    config = DurableConfig(base_url=server.url, retry=PATIENT, live_timeout=10)
    writer_config = DurableConfig(base_url=server.url, retry=PATIENT)
    with DurableStreamsClient(config) as client, DurableStreamsClient(writer_config) as writer:
        s = writer.stream("/restart")
        s.create("application/json")
        first = [{"n": i} for i in range(2000)]
        s.append_json(first)
        tail = Tail(client, "/restart", live)
        got: list[Any] = []
        tail.until(first, got)
        # The reader is caught up and now waits (pending long-poll or open SSE): kill it.
        restart(server)
        second = [{"n": i} for i in range(2000, 2100)]
        s.append_json(second)
        tail.until(first + second, got)
        # Once more, killed right after an append so the reader may be mid-request.
        third = [{"n": i} for i in range(2100, 2200)]
        s.append_json(third)
        restart(server)
        s.close()
        tail.until(first + second + third, got)
        tail.thread.join(DEADLINE)
        assert not tail.thread.is_alive() and tail.reader.closed
        assert got == first + second + third
        assert tail.reader.reconnects >= 1


def test_catch_up_resumes_between_chunks(server: DurableServer) -> None:
    with DurableStreamsClient(DurableConfig(base_url=server.url, retry=PATIENT)) as client:
        s = client.stream("/catch-up")
        s.create("application/json")
        s.append_json(list(range(1000)))
        reader = s.read("-1", live="long-poll")
        got = next(reader).messages()
        server.kill()
        # The reader's next request meets a dead server and backs off until it is back.
        rest: list[Any] = []
        thread = threading.Thread(target=lambda: rest.extend(c for c in reader), daemon=True)
        thread.start()
        deadline = time.monotonic() + DEADLINE
        while reader.reconnects == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert reader.reconnects >= 1
        server.start()
        s.append_json(list(range(1000, 1500)))
        s.close()
        thread.join(DEADLINE)
        for chunk in rest:
            got += chunk.messages()
        assert got == list(range(1500))
