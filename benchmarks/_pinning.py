"""Where a benchmark's processes run, and the CPU each side of it spends.

A benchmark that starts a local server (the local S2 server, the Durable Streams reference
server) on the same cores as Spark measures the server as much as the connector: with a
managed service the server is not on your cores. So, where the machine gives this
process 2 or more CPUs, the server gets one of its own (the last) and everything else
the others: this process (the driver, producers and in-process peers), the Spark JVM it
starts and that JVM's Python workers. `--no-pin` leaves every process on every CPU (the
figures from before this existed); each benchmark prints which mode it ran.

Affinity is inherited by the threads and processes made after it is set, so:

    ap = argparse.ArgumentParser()
    add_pin_option(ap)
    args = ap.parse_args()
    placement = placed(args)  # this process pinned: before Spark or any peer starts
    with ServerProcess() as server:  # an S2 server: `_servers.s2_server`, which pins it
        placement.pin_server(server.pid)  # every thread of the running server
        cpu = CpuMeter(server=server.pid)
        with cpu.printed("s2 reader"):  # prints `  s2 reader: CPU s JVM 0.61, ...`
            ...  # one measured run
        before = cpu.sample()  # or by hand, to add runs up
        spent = cpu.since(before)  # {"JVM": 0.61, "Python workers": 0.42, ...}

`CpuMeter` splits CPU seconds (user + system, from /proc) by side: the JVMs and Python
processes descended from this process (Spark's), the server(s), and this process itself.
Linux only; elsewhere pinning is skipped (and said so) and CPU reads 0.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

__all__ = ["CpuMeter", "Placement", "add_pin_option", "cpu_seconds", "placed",
           "python_workers", "resident"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def add_pin_option(parser: argparse.ArgumentParser) -> None:
    """`--no-pin`: leave the server on the same CPUs as everything else."""
    parser.add_argument(
        "--no-pin", action="store_true",
        help="do not give the local server a CPU of its own (by default, with 2 or more "
             "CPUs, the server runs on one and Spark and this process on the others)")


@dataclass(frozen=True)
class Placement:
    """The CPUs of the server and of the rest; equal (every CPU) when not pinned."""

    pinned: bool
    server_cpus: frozenset[int]
    rest_cpus: frozenset[int]
    why_not: str = ""  # when not pinned: why

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Placement:
        return cls.choose(pin=not args.no_pin)

    @classmethod
    def choose(cls, *, pin: bool = True) -> Placement:
        """The server on the last of this process's CPUs, the rest on the others."""
        if not hasattr(os, "sched_getaffinity"):
            return cls(False, frozenset(), frozenset(), "no CPU affinity on this system")
        cpus = frozenset(os.sched_getaffinity(0))
        if not pin:
            return cls(False, cpus, cpus, "--no-pin")
        if len(cpus) < 2:
            return cls(False, cpus, cpus, "a single CPU")
        last = max(cpus)
        return cls(True, frozenset({last}), cpus - {last})

    @property
    def mode(self) -> str:
        """One word for summary lines: `pinned` or `unpinned`."""
        return "pinned" if self.pinned else "unpinned"

    def describe(self, *, server_started: bool = True) -> str:
        """One line; `server_started=False`: the server runs already (`--server URL`), so
        its CPU is only left free for it, not given to it."""
        if not self.pinned:
            return (f"placement: unpinned ({self.why_not}): the server and everything else "
                    f"share CPUs {_cpus(self.rest_cpus)}")
        rest = (f"this process and what it starts (Spark's JVM and Python workers) on CPU "
                f"{_cpus(self.rest_cpus)}")
        if not server_started:
            return (f"placement: pinned: {rest}; CPU {_cpus(self.server_cpus)} left to the "
                    f"server, which runs already and is not pinned here")
        return f"placement: pinned: the server on CPU {_cpus(self.server_cpus)}; {rest}"

    def pin_rest(self) -> None:
        """This process and its threads on the rest's CPUs: call it before starting Spark
        or any other process that should run there (they inherit it)."""
        if self.pinned:
            _pin_all_threads(os.getpid(), self.rest_cpus)

    def pin_server(self, pid: int | None) -> None:
        """A running server process, every thread of it, on the server's CPUs."""
        if self.pinned and pid is not None:
            _pin_all_threads(pid, self.server_cpus)


def placed(args: argparse.Namespace) -> Placement:
    """The placement `--no-pin` asks for, with this process already on the rest's CPUs
    (call it before Spark or any peer process starts) and the mode printed (with
    `--server URL`, `_servers`: a server running already, not pinned here)."""
    placement = Placement.from_args(args)
    placement.pin_rest()
    running = str(getattr(args, "server", "")).startswith(("http://", "https://"))
    print(placement.describe(server_started=not running))
    return placement


def _cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _pin_all_threads(pid: int, cpus: frozenset[int]) -> None:
    """`sched_setaffinity` moves one thread: move each of the process's threads."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue  # a thread that just ended


def cpu_seconds(pid: int | None, *, children: bool = False) -> float:
    """User + system CPU seconds of a process (with `children`: plus those of its ended
    children it waited for); 0 where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, TypeError):
        return 0.0
    used = int(fields[11]) + int(fields[12])
    if children:
        used += int(fields[13]) + int(fields[14])
    return used / _TICK


def _descendants(root: int) -> list[tuple[int, list[bytes]]]:
    """`root`'s descendants (pid, argv): our JVM and its Python workers, not those of
    other Spark sessions on the machine."""
    tree: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    out: list[tuple[int, list[bytes]]] = []
    todo = [root]
    while todo:
        for pid in tree.get(todo.pop(), []):
            todo.append(pid)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    out.append((pid, f.read().split(b"\0")))
            except OSError:
                continue
    return out


def _is_jvm(argv: list[bytes]) -> bool:
    return argv[0].endswith(b"/java") or argv[0] == b"java"


def _python_kind(argv: list[bytes]) -> str | None:
    """Which Spark Python process this is: `workers` run tasks (`pyspark.worker`, through
    its daemon), `planners` everything else Spark starts on the driver (data source
    lookups and creation, plans, the streaming sources' runners); None: not Spark's."""
    if b"python" not in argv[0]:
        return None
    modules = [a for a in argv[1:] if a.startswith(b"pyspark.")]
    if not modules:
        return None
    return "workers" if modules[-1] == b"pyspark.worker" else "planners"


def python_workers() -> list[int]:
    """Pids of this process's Spark Python processes that run tasks (the daemon and the
    workers it forks)."""
    return [pid for pid, argv in _descendants(os.getpid()) if _python_kind(argv) == "workers"]


def _status_kib(pid: int, field: bytes) -> int:
    """A `/proc/<pid>/status` field in KiB (VmRSS: resident now; VmHWM: its peak); 0 when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(field + b":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _memory_side(argv: list[bytes]) -> str | None:
    if _is_jvm(argv):
        return "JVM"
    if any(a.endswith(b"python_streaming_source_runner") for a in argv):
        return "streaming reader"  # a query's driver-side reader: its plans and offsets
    kind = _python_kind(argv)
    return None if kind is None else f"Python {kind}"


def resident() -> dict[str, tuple[float, float]]:
    """MiB resident now and at peak of the largest process of each side: the Spark JVM,
    the streaming queries' driver-side readers, the other Python planners, the Python
    workers and this process (the driver's Python side)."""
    largest: dict[str, tuple[float, float]] = {}
    sides = [(pid, _memory_side(argv)) for pid, argv in _descendants(os.getpid())]
    for pid, side in [*sides, (os.getpid(), "this process")]:
        if side is not None:
            now = _status_kib(pid, b"VmRSS") / 1024, _status_kib(pid, b"VmHWM") / 1024
            largest[side] = max(largest.get(side, (0.0, 0.0)), now)
    return largest


#: One sample: side -> pid -> CPU seconds so far.
Sample = dict[str, dict[int, float]]


class CpuMeter:
    """CPU seconds per side over a run: the Spark JVM, its Python workers (tasks) and
    planners (driver-side Python), the server(s) and this process (the driver's Python
    side, producers, in-process peers). Processes started during the run count whole
    (a new query's planner pays its imports)."""

    def __init__(self, *, server: int | None = None,
                 others: Mapping[str, int | None] | None = None,
                 here: str = "this process") -> None:
        """`server`: the server's pid; `others`: more processes by side name (a peer
        process, a second server); `here`: what this process's side is called."""
        given = {"server": server, **(others or {})}
        self._pids = {name: pid for name, pid in given.items() if pid is not None}
        self._here = here

    def sample(self) -> Sample:
        """Each Spark process's seconds are its own and those of its ended children it
        waited for (a daemon's forks); the JVM's ended children (streaming sources'
        runners) count as planners', under a key no live pid has."""
        out: Sample = {"JVM": {}, "Python workers": {}, "Python planners": {}}
        named = set(self._pids.values())  # a server's own side, even a JVM (Kafka)
        for pid, argv in _descendants(os.getpid()):
            if pid in named:
                continue
            if _is_jvm(argv):
                own = out["JVM"][pid] = cpu_seconds(pid)
                out["Python planners"][-pid] = cpu_seconds(pid, children=True) - own
            elif (kind := _python_kind(argv)) is not None:
                out[f"Python {kind}"][pid] = cpu_seconds(pid, children=True)
        for name, pid in self._pids.items():
            out[name] = {pid: cpu_seconds(pid, children=True)}
        out[self._here] = {os.getpid(): cpu_seconds(os.getpid())}
        return out

    def since(self, before: Sample) -> dict[str, float]:
        """Seconds each side spent since `before` (processes new since count whole;
        sides without a process, such as Spark's in a benchmark without Spark, left out)."""
        now = self.sample()
        return {side: max(0.0, sum(t - before.get(side, {}).get(p, 0.0)
                                   for p, t in pids.items()))
                for side, pids in now.items() if pids or before.get(side)}

    @contextlib.contextmanager
    def printed(self, label: str) -> Iterator[dict[str, float]]:
        """Print `  <label>: CPU s <side> <s>, ...` after the block; the dict it yields
        holds the same seconds then."""
        spent: dict[str, float] = {}
        before = self.sample()
        yield spent
        spent.update(self.since(before))
        print(f"  {label}: CPU s {self.format(spent)}")

    @staticmethod
    def format(spent: Mapping[str, float]) -> str:
        return ", ".join(f"{side} {t:.2f}" for side, t in spent.items())
