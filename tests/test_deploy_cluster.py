"""On a real standalone cluster: executors and their Python workers are other processes.

One master and two 1-core workers per test session (tests/_deploy.py); the driver is
`spark-submit --master spark://...` running examples/cluster_job.py from a directory
outside the repository, so executors see only the installed package.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _deploy import SPARK_HOME, StandaloneCluster, wait_until

from s2_spark.s2 import AppendRecord, S2Client, S2Config

pytestmark = pytest.mark.cluster

JOB = Path(__file__).resolve().parent.parent / "examples" / "cluster_job.py"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


def submit(cluster: StandaloneCluster, cwd: Path, *args: str) -> subprocess.Popen[str]:
    """Start examples/cluster_job.py on the cluster; output goes to cwd/driver.log."""
    argv = [
        str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.master_url,
        "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1",
        "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
        "--driver-memory", "512m", str(JOB), *args,
    ]
    with open(cwd / "driver.log", "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(argv, cwd=cwd, env=cluster.env, stdout=log,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(driver: subprocess.Popen[str], cwd: Path, timeout: float = 480) -> str:
    """Wait for the driver; its whole process group goes if it overruns."""
    try:
        driver.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    log = (cwd / "driver.log").read_text(errors="replace")
    assert driver.returncode == 0, log[-6000:]
    return log


def bodies(client: S2Client, basin: str, stream: str) -> list[str]:
    """Every data record's body (command records skipped), in seq_num order."""
    handle = client.basin(basin).stream(stream)
    tail, out, seq = handle.check_tail().seq_num, [], 0
    while seq < tail:
        rows = handle.read(seq_num=seq).batch.to_pylist()
        out += [row["body"].decode() for row in rows if not is_command(row)]
        seq = rows[-1]["seq_num"] + 1
    return out


def is_command(row: dict[str, Any]) -> bool:
    return len(row["headers"]) == 1 and row["headers"][0]["name"] == b""


def fill(client: S2Client, basin: str, stream: str, bodies: list[str]) -> None:
    handle = client.basin(basin).stream(stream)
    for i in range(0, len(bodies), 1000):
        handle.append([AppendRecord(b.encode()) for b in bodies[i:i + 1000]])


def job_args(url: str, source: str, streams: str, target: str, checkpoint: Path) -> list[str]:
    return ["--endpoint", url, "--source-basin", source, "--streams", streams,
            "--target-basin", target, "--checkpoint", str(checkpoint)]


def test_copy_survives_executor_kill_and_restarts_from_checkpoint(
    cluster: StandaloneCluster, s2_server: Any, unique: Any, tmp_path: Path
) -> None:
    """Two source streams, two tasks. Once a task has appended some records, the
    application's executor processes are stopped (SIGSTOP), a copy is checked to be
    incomplete, the executor JVMs are killed (SIGKILL) and their orphaned Python workers
    resumed: Spark gets new executors, reruns the lost tasks, and the target has every
    record exactly once, in order. A second run from the checkpoint copies only what
    arrived since."""
    source, target, count = unique("cluster-src"), unique("cluster-dst"), 2000
    expected = {s: [f"{s}-{i:05d}" for i in range(count)] for s in ("a", "b")}
    args = job_args(s2_server.url, source, "a,b", target, tmp_path / "checkpoint")
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        client.create_basin(source)
        client.create_basin(target)
        for stream, records in expected.items():
            client.basin(source).create_stream(stream)
            fill(client, source, stream, records)

        # Small appends, two in flight, make the batch long enough to be caught mid-way.
        driver = submit(cluster, tmp_path, *args, "--max-records-per-append", "4",
                        "--max-appends-in-flight", "2")
        try:
            kill_one_executor_mid_batch(cluster, client, target, count, driver, tmp_path)
        finally:
            log = finish(driver, tmp_path, 600)
        assert f"copied {2 * count} records" in log
        for stream, records in expected.items():
            assert bodies(client, target, stream) == records

        fill(client, source, "a", ["a-late"])
        log = finish(submit(cluster, tmp_path, *args), tmp_path)
        assert "copied 1 records" in log
        assert bodies(client, target, "a") == [*expected["a"], "a-late"]
        assert bodies(client, target, "b") == expected["b"]


def kill_one_executor_mid_batch(cluster: StandaloneCluster, client: S2Client, target: str,
                                count: int, driver: subprocess.Popen[str], cwd: Path) -> None:
    def started(stream: str) -> bool:
        try:
            return client.basin(target).stream(stream).check_tail().seq_num > 0
        except Exception:  # the writer has not created it yet
            return False

    def alive() -> None:
        assert driver.poll() is None, (cwd / "driver.log").read_text()[-6000:]

    wait_until("a copy task appending", lambda: started("a") or started("b"), 480, alive)
    app = cluster.state()["activeapps"][0]["id"]
    executors = cluster.executors(app)
    assert len(executors) == 2, executors
    frozen = cluster.executor_processes(app)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        # Nothing of the application runs now: a task that has appended some of its records
        # but not all is cut mid-batch when its executor dies.
        cut = {s: len(bodies(client, target, s)) if started(s) else 0 for s in ("a", "b")}
        assert any(0 < n < count for n in cut.values()), cut
        for pid in executors:
            os.kill(pid, signal.SIGKILL)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
