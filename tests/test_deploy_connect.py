"""Through Spark Connect: a server started from the PySpark install, s2-spark installed on
its side only as a package, and examples/connect_client.py as the client.

The client runs in a child process: a Connect session switches PySpark into Connect mode
for its whole process, which the shared classic local[2] session of this test run must
not see.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _deploy import ConnectServer

from s2_spark.client import AppendRecord, S2Client, S2Config

pytestmark = pytest.mark.connect

CLIENT = Path(__file__).resolve().parent.parent / "examples" / "connect_client.py"


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    server = ConnectServer(tmp_path_factory.mktemp("connect"))
    try:
        yield server
    finally:
        server.stop()


def run_client(server: ConnectServer, cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(CLIENT), "--remote", server.url, *args],
        cwd=cwd, env=server.env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, (done.stderr[-4000:], server.daemon.log_tail())
    return done.stdout


def test_connect_client_reads_and_copies_exactly_once(
    connect_server: ConnectServer, s2_server: Any, unique: Any, tmp_path: Path
) -> None:
    basin = unique("connect")
    args = ["--endpoint", s2_server.url, "--basin", basin, "--source", "events",
            "--target", "copy", "--checkpoint", str(tmp_path / "checkpoint")]
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream("events")
        events = client.basin(basin).stream("events")
        events.append([AppendRecord(b) for b in (b"one", b"two", b"three")])

        out = run_client(connect_server, tmp_path, *args)
        assert out.splitlines() == [
            "source: ['one', 'two', 'three']",
            "target: ['one', 'two', 'three']",
        ]

        events.append([AppendRecord(b) for b in (b"four", b"five")])
        out = run_client(connect_server, tmp_path, *args)
        assert out.splitlines() == [
            "source: ['one', 'two', 'three', 'four', 'five']",
            "target: ['one', 'two', 'three', 'four', 'five']",
        ]
