"""Where Spark's Python processes spend their CPU, by sampling them with py-spy: in
s2-spark's code, in the `gc.collect()` Spark's daemon runs after every call of a reused
worker, in imports, and in the rest of Spark's Python machinery (sockets, pickling, its
worker loop). CPU accounting per process (`_pinning.CpuMeter`) says how much; this says
whose.

py-spy leaves out threads that wait (on a socket, a lock) but counts those that wait for a
CPU, so a part's samples over the rate are its seconds running or runnable: on a loaded
machine more than its CPU seconds, and more so for a part that runs while the JVM is busy
(the daemon's collection right after a task). The shares of the samples are what to read,
beside each process's CPU from /proc, and as a bound, not a measure, on a busy machine.
Tracing Spark's processes needs the right to: run as root, or with
`kernel.yama.ptrace_scope` 0.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from types import TracebackType

from _pinning import _python_kind

PARTS = ("s2-spark", "daemon gc.collect", "imports", "Spark's rest")


def _gc_lines() -> set[str]:
    """The `daemon.py:<line>` frames of pyspark's daemon that call `gc.collect()` (line
    numbers differ between PySpark releases)."""
    import pyspark

    source = Path(pyspark.__file__).with_name("daemon.py").read_text().splitlines()
    return {f"daemon.py:{n}" for n, line in enumerate(source, 1) if "gc.collect()" in line}


def part_of(frames: list[str], gc_lines: set[str]) -> str:
    """Which part one sampled stack (outermost frame first, not empty) is spent in: a
    stack through s2-spark's code is ours, including what it calls (pyarrow reading the
    task's input, as any Python sink's does)."""
    if any("s2_spark/" in f for f in frames):
        return "s2-spark"
    if any(line in frames[-1] for line in gc_lines):
        return "daemon gc.collect"
    if any("<frozen importlib" in f for f in frames):
        return "imports"
    return "Spark's rest"


class Sampler:
    """py-spy recording this process and every process it starts (Spark's JVM and, through
    it, the Python workers and planners) while the `with` block runs."""

    def __init__(self, rate: int = 200) -> None:
        exe = shutil.which("py-spy")
        if exe is None:
            raise SystemExit("--py-spy needs py-spy (pip install py-spy)")
        self._exe, self.rate = exe, rate
        self._out = Path(tempfile.mkdtemp(prefix="s2-py-spy-")) / "stacks.txt"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Sampler:
        self._proc = subprocess.Popen(
            [self._exe, "record", "--pid", str(os.getpid()), "--subprocesses",
             "--nonblocking", "--rate", str(self.rate), "--format", "raw",
             "--output", str(self._out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        _, err = self._proc.communicate(timeout=120)
        if not self._out.exists():
            raise SystemExit(f"py-spy recorded nothing: {err.decode(errors='replace')[-500:]}")

    def split(self) -> dict[str, Counter[str]]:
        """Sampled seconds of Spark's Python processes by side ("Python planners", "Python
        workers") and part (`PARTS`)."""
        gc_lines = _gc_lines()
        out: dict[str, Counter[str]] = {}
        for line in self._out.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            owners = [f for f in frames if f.startswith("process ")]
            if not owners or not count.isdigit():
                continue
            argv = owners[-1].partition(":")[2].strip('"').encode().split()
            own = frames[frames.index(owners[-1]) + 1:]
            kind = _python_kind(argv) if argv else None
            if kind is None or not own:
                continue
            side = out.setdefault(f"Python {kind}", Counter())
            side[part_of(own, gc_lines)] += int(count) / self.rate
        return out
