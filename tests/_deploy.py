"""Real Spark deployments for tests: a standalone cluster and a Spark Connect server.

Both are started from the PySpark install (SPARK_HOME is the `pyspark` package directory),
bound to 127.0.0.1 on free ports, with their Python workers running `sys.executable` (the
interpreter that has s2-spark installed) from a directory outside the repository, so the
connector is found only as an installed package. Every JVM runs in its own process group,
so stopping one also ends its children (executors, Python workers).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark
from _spark_site import with_spark_site

SPARK_HOME = Path(pyspark.__file__).parent


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports: all held at once while asked for, so that daemons started
    together (a master and its workers bind only seconds later) never get the same one."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def wait_until(what: str, check: Callable[[], bool], deadline_s: float,
               alive: Callable[[], None] = lambda: None) -> None:
    """Poll `check` until it holds; `alive` raises when what we wait on has died."""
    deadline = time.monotonic() + deadline_s
    while True:
        alive()
        if check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {deadline_s:.0f}s")
        time.sleep(0.1)


def spark_env(work: Path) -> dict[str, str]:
    """Environment for Spark JVMs and drivers: our interpreter, logs and scratch in `work`."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOG_DIR=str(work / "logs"),
        SPARK_LOCAL_DIRS=str(work / "local"),
        # An empty conf folder: the suite's (where the class archive is made for it) or
        # one of `work`'s.
        SPARK_CONF_DIR=os.environ.get("SPARK_CONF_DIR") or str(work / "conf"),
    )
    # Not the suite's path: a cluster's workers find s2_spark installed. Only the folder that
    # has them import pyspark compiled (_spark_site).
    env.pop("PYTHONPATH", None)
    if (python_path := with_spark_site(None)) is not None:
        env["PYTHONPATH"] = python_path
    Path(env["SPARK_CONF_DIR"]).mkdir(parents=True, exist_ok=True)
    return env


class Daemon:
    """One long-running Spark JVM in its own process group, its output in a log file."""

    def __init__(self, name: str, argv: list[str], work: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = work / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                               + self.log_tail())

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def descendants(self) -> list[tuple[int, str]]:
        """(pid, command line) of every live process under this one."""
        children: dict[int, list[int]] = {}
        cmdlines: dict[int, str] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
            cmdlines[int(entry.name)] = cmd
        found, todo = [], [self.proc.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append((child, cmdlines[child]))
                todo.append(child)
        return found

    def stop(self) -> None:
        """SIGTERM the group, then SIGKILL whatever is left of it after a grace period."""
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(grace)
                if sig == signal.SIGKILL or not self._group_alive():
                    return
            except subprocess.TimeoutExpired:
                continue

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except ProcessLookupError:
            return False


class StandaloneCluster:
    """A standalone master and two 1-core workers on 127.0.0.1."""

    def __init__(self, work: Path, workers: int = 2) -> None:
        self.work = work
        self.env = spark_env(work)
        self.port, self.ui_port, *self._worker_ports = free_ports(2 + 2 * workers)
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.daemons: list[Daemon] = []
        self.workers: list[Daemon] = []
        self._start(workers)

    def _start(self, workers: int) -> None:
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        env = {**self.env, "SPARK_DAEMON_MEMORY": "256m"}
        try:
            master = Daemon("master", [
                spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(self.port), "--webui-port", str(self.ui_port),
            ], self.work, env)
            self.daemons.append(master)
            for i in range(workers):
                work_dir = self.work / f"worker-{i}"
                work_dir.mkdir()
                worker = Daemon(f"worker-{i}", [
                    spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url,
                    "--host", "127.0.0.1", "--port", str(self._worker_ports[2 * i]),
                    "--webui-port", str(self._worker_ports[2 * i + 1]),
                    "--cores", "1", "--memory", "1g", "--work-dir", str(work_dir),
                ], work_dir, env)
                self.daemons.append(worker)
                self.workers.append(worker)
            wait_until("standalone cluster", lambda: self.alive_workers() == workers, 90,
                       self._all_alive)
        except BaseException:
            self.stop()
            raise

    def _all_alive(self) -> None:
        for daemon in self.daemons:
            daemon.alive()

    def state(self) -> dict[str, Any]:
        """The master's status JSON (workers, applications)."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return dict(json.load(resp))

    def alive_workers(self) -> int:
        try:
            workers = self.state().get("workers", [])
        except (OSError, ValueError):
            # Not up, or up but not yet serving its JSON (a starting master's UI answered
            # /json/ with an HTML page once, under load): ask again.
            return 0
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def executors(self, app_id: str) -> list[int]:
        """PIDs of the executor JVMs the workers run for one application."""
        return [pid for worker in self.workers for pid, cmd in worker.descendants()
                if "CoarseGrainedExecutorBackend" in cmd and f"--app-id {app_id} " in cmd
                and cmd.split()[0].endswith("java")]

    def executor_processes(self, app_id: str) -> list[int]:
        """PIDs of one application's executor JVMs and everything they started."""
        found = []
        for worker in self.workers:
            tree = worker.descendants()
            roots = {pid for pid, cmd in tree if f"--app-id {app_id} " in cmd}
            found += [pid for pid, cmd in tree if pid in roots or self._under(pid, roots)]
        return found

    @staticmethod
    def _under(pid: int, roots: set[int]) -> bool:
        while pid > 1:
            try:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                return False
            if pid in roots:
                return True
        return False

    def logs(self) -> str:
        return "\n".join(f"--- {d.name}\n{d.log_tail(2000)}" for d in self.daemons)

    def stop(self) -> None:
        for daemon in reversed(self.daemons):
            daemon.stop()


class ConnectServer:
    """A Spark Connect server (local[2] inside) on a free loopback port."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.env = {**spark_env(work), "SPARK_CONNECT_MODE": "0"}
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.daemon = Daemon("connect", [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master", "local[2]", "--name", "s2-spark-connect-tests",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={self.port}",
            "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.driver.memory=1g",
            "--conf", f"spark.local.dir={work / 'local'}",
            "spark-internal",
        ], work, self.env)
        try:
            wait_until("Spark Connect server", self._accepts, 120, self.daemon.alive)
        except BaseException:
            self.stop()
            raise

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        self.daemon.stop()
