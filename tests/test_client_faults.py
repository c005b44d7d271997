"""The client against a server process that is SIGKILLed and restarted on its data dir."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from s2_spark.errors import UnavailableError
from s2_spark.s2 import AppendRecord, RetryPolicy, S2Client, S2Config
from s2_spark.testing import ServerProcess

PATIENT = RetryPolicy(max_attempts=30, initial_backoff=0.05, max_backoff=0.5)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(data_dir=tmp_path / "data", heartbeat_interval=0.5)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def body(i: int) -> bytes:
    return f"{i:010d}".encode().ljust(100, b"#")


def restart_later(server: ServerProcess, delay: float) -> threading.Thread:
    done = threading.Event()

    def run() -> None:
        done.wait(delay)
        server.start()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_read_session_survives_kill_and_restart(
    server: ServerProcess, unique: Callable[[str], str]
) -> None:
    basin, name = unique("basin"), unique("stream")
    with S2Client(S2Config(endpoint=server.url, retry=PATIENT)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream(name)
        stream = client.basin(basin).stream(name)
        stream.append_many(AppendRecord(body(i)) for i in range(20_000))

        session = stream.read_session(seq_num=0, count=40_000, wait=60)
        seen: list[int] = []
        bodies: list[bytes] = []
        first = next(session)
        seen.extend(first.batch.column("seq_num").to_pylist())
        bodies.extend(first.batch.column("body").to_pylist())
        assert 0 < len(seen) < 20_000

        server.kill()  # mid-stream: most of the catch-up has not been delivered yet
        restarter = restart_later(server, 1.0)
        for batch in session:
            seen.extend(batch.batch.column("seq_num").to_pylist())
            bodies.extend(batch.batch.column("body").to_pylist())
            if len(seen) == 20_000:
                # caught up after the restart: the rest arrives live
                restarter.join()
                stream.append_many(AppendRecord(body(i)) for i in range(20_000, 40_000))
        restarter.join()
    assert seen == list(range(40_000))
    assert bodies == [body(i) for i in range(40_000)]
    assert session.reconnects >= 1


def test_appends_retry_only_when_safe(server: ServerProcess, unique: Callable[[str], str]) -> None:
    basin, name = unique("basin"), unique("stream")
    with S2Client(S2Config(endpoint=server.url, retry=PATIENT)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream(name)
        stream = client.basin(basin).stream(name)
        stream.append([AppendRecord(b"0")])

        # Server down: the connection is refused, nothing was sent, so retrying is safe.
        server.kill()
        restarter = restart_later(server, 1.0)
        ack = stream.append([AppendRecord(b"1")])
        restarter.join()
        assert (ack.start.seq_num, ack.end.seq_num) == (1, 2)

        server.kill()
        restarter = restart_later(server, 1.0)
        ack = stream.append([AppendRecord(b"2")], match_seq_num=2)
        restarter.join()
        assert ack.end.seq_num == 3
        assert stream.read(seq_num=0).batch.column("body").to_pylist() == [b"0", b"1", b"2"]

    # With retries disabled the failure surfaces as UnavailableError naming the stream.
    server.kill()
    no_retry = S2Config(endpoint=server.url, retry=RetryPolicy(max_attempts=1))
    with S2Client(no_retry) as c, pytest.raises(UnavailableError, match=name):
        c.basin(basin).stream(name).append([AppendRecord(b"x")])
    server.start()


def test_unbounded_session_resumes_after_graceful_restart(
    server: ServerProcess, unique: Callable[[str], str]
) -> None:
    basin, name = unique("basin"), unique("stream")
    with S2Client(S2Config(endpoint=server.url, retry=PATIENT)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream(name)
        stream = client.basin(basin).stream(name)
        stream.append_many(AppendRecord(body(i)) for i in range(100))
        seen: list[int] = []
        with stream.read_session(seq_num=0) as session:  # unbounded: follows the tail
            for batch in session:
                seen.extend(batch.batch.column("seq_num").to_pylist())
                if len(seen) == 100:
                    server.stop()  # SIGTERM: a graceful shutdown
                    server.start()
                    stream.append_many(AppendRecord(body(i)) for i in range(100, 200))
                if len(seen) >= 200:
                    break
        assert seen == list(range(200))
        assert session.reconnects >= 1
