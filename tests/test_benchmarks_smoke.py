"""Every benchmark in benchmarks/ runs, at smoke size: a benchmark that stops running fails
here, not unnoticed until someone runs it by hand (issue 52).

Each script's `main(argv)` is called in this process with options that make it small (a
few hundred records, one round, a second or less where it measures over time, no warm-up
runs, no CPU pinning: this process must not stay pinned for the tests after it), so its real
code paths run, and the test checks that it ended with its summary line (its name and the
shape of its figures, never their values). Nothing here is a measurement.

Costs kept down: the Spark benchmarks run in the suite's one Spark session
(`benchmarks/_spark.py` lends it to them, applies their runtime settings for the run and
puts them back); the S2 benchmarks share one local S2 server of this module's
(`--server URL`), except `append`, which starts its own as every benchmark does by
default; the servers a benchmark is about (`server.py`'s two stacks, the Durable Streams
reference server) it starts itself. `kafka_compare` runs its S2 side (`--no-kafka`): the
suite has no Kafka broker, and Spark's Kafka connector is not published for every
PySpark (none for 4.3); its exactly-once part (a Spark of its own in a child process,
killed and run again) is left out for its cost: see `KAFKA_COMPARE_EOS`.

Each benchmark is loaded under a name of its own (benchmarks/requests.py is not
`requests`), and Spark pickles the modules of benchmarks/ by value, as it does a script's
`__main__`, since Spark's Python processes cannot import them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import resource
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

#: How a summary line ends: the placement (and, against the module's server, that it is
#: not the benchmark's own).
MODE = r"\(unpinned(, a running server not pinned here)?\)"
NO_PIN = ("--no-pin",)
N = "300"  # records, rows or messages of a smoke run

#: Why kafka_compare's `eos` part is not in its smoke run.
KAFKA_COMPARE_EOS = (
    "kafka_compare's eos part runs its copy in a child process with a Spark of its own, to "
    "SIGKILL it: even run once, unkilled (--kills 0, 200 records), it cost about 75 s of "
    "CPU, against about 170 s for every other smoke run here together; its copy pipeline "
    "(System.reader/writer) is the write part's, which runs")


@dataclass(frozen=True)
class Smoke:
    """A benchmark's smoke options and the pattern its last line must match; `spark`: it
    runs Spark queries; `server`: it takes `--server` (given the module's S2 server)."""

    args: tuple[str, ...]
    last: str
    spark: bool = False
    server: bool = False


#: Every benchmark (a script of benchmarks/ not named `_*`), in the order they run.
SMOKE: dict[str, Smoke] = {
    "decode": Smoke(("--records", N, "--big-records", "20", "--budget", "0"),
                    r"decode: \d+ records/s, [\d.]+x s2-sdk"),
    "wire_builds": Smoke(("--rounds", "1", "--records", N, "--big-records", "20",
                          "--messages", "100"),
                         r"wire builds: limited API [\d.]+x the full API \(decode\), "
                         r"pure Python [\d.]+x"),
    # The one S2 benchmark that starts its server as they all do by default.
    "append": Smoke(("--records", N, *NO_PIN),
                    rf"append: \d+ records/s, [\d.]+x s2-sdk {MODE}"),
    "read_session": Smoke(("--records", N, *NO_PIN),
                          rf"read_session: \d+ records/s, [\d.]+x s2-sdk .*{MODE}", server=True),
    "requests": Smoke(("--requests", "50", "--warmup", "20", "--repeat", "1", *NO_PIN),
                      r"requests: tail [\d.]+x http\.client, read [\d.]+x, append [\d.]+x "
                      rf"\(httpx Client [\d.]+x\) {MODE}", server=True),
    "bulk_requests": Smoke(("--streams", "50", "--repeat", "1", *NO_PIN),
                           r"bulk_requests: tail [\d.]+ us, read [\d.]+ us, append [\d.]+ us"
                           r"(, bodies [\d.]+ us)? a request; (tail [\d.]+x server, read "
                           rf"[\d.]+x server, append [\d.]+x server|server CPU n/a) {MODE}",
                           server=True),
    "sink_rows": Smoke(("--rows", N, "--batch", "100", "--streams", "3", "--repeat", "1",
                        *NO_PIN),
                       r"sink_rows: \d+ ns a row into one stream \(([\d.]+x|n/a) the "
                       r"server's CPU\), \d+ ns a row into several \(3\) streams "
                       r"\(([\d.]+x|n/a) the server's\), "
                       rf"\d+ rows/s into one stream, \d+ rows/s into several {MODE}",
                       server=True),
    "compression": Smoke(("--streams", "3", "--records", "10", "--rounds", "1", "--repeat",
                          "1", *NO_PIN),
                         r"compression: zstd .*x bytes; gzip .*\(vs none, unpinned"
                         r"(, a running server not pinned here)?\)", server=True),
    "replay": Smoke(("--rows", N, "--landed", "100", *NO_PIN),
                    r"replay: another order ([\d.]+x|n/a \(too little to measure\)) the same "
                    rf"order's client CPU, .* records read \(\d+ landed\) {MODE}", server=True),
    "watch_polls": Smoke(("--streams", "10", "--wait", "1", "--settle", "0.5", "--seconds",
                          "0.5", "--repeat", "1", *NO_PIN),
                         r"watch_polls: h2 [\d.]+ ms/poll, http/1\.1 [\d.]+ ms/poll "
                         rf"\([\d.]+x\), server .+ {MODE}", server=True),
    "idle_reader": Smoke(("--streams", "50", "--settle", "0.3", "--window", "0.5",
                          "--duration", "0.5", "--interval", "100", *NO_PIN),
                         rf"idle_reader: 50 streams, .* req/s per stream, .*{MODE}",
                         server=True),
    "server": Smoke(("--requests", "50", "--connections", "2", "--streams", "10", "--wait",
                     "1", "--settle", "0.2", "--poll-seconds", "0.3", "--records", N,
                     "--repeat", "1", *NO_PIN),
                    r"server: granian append [\d.]+ ms, tail [\d.]+ ms, read [\d.]+ ms, "
                    r"long-poll h1 [\d.]+ ms, long-poll h2 [\d.]+ ms, s2s read 1M [\d.]+ ms; "
                    rf"[\d.]+x-[\d.]+x less CPU than hypercorn {MODE}"),
    "durable_append": Smoke(("--messages", N, "--peer-messages", "100", "--threads", "4",
                             "--rounds", "1", *NO_PIN),
                            r"durable_append: [\d,]+ msgs/s, [\d.]+x durable-streams \(PyPI\) "
                            + MODE),
    "durable_read": Smoke(("--messages", N, "--rounds", "1", *NO_PIN),
                          r"durable_read: [\d,]+ msgs/s, [\d.]+x durable-streams \(PyPI\) "
                          + MODE),
    "spark_read": Smoke(("--records", N, "--repeat", "1", "--no-warmup", *NO_PIN),
                        r"spark_read: \d+ rows/s, [\d.]+x in-memory ceiling, .*scaling "
                        rf"[\d.]+x of ceiling's gain, worker CPU per row .*x {MODE}",
                        spark=True, server=True),
    "spark_write": Smoke(("--rows", "150", "--rows-per-batch", "150", *NO_PIN),
                         r"spark_write: \d+ rows/s, [\d.]+x discard writer, [\d.]+x s2-sdk "
                         rf"producer {MODE}", spark=True, server=True),
    "pushdown": Smoke(("--records", N, "--repeat", "1", "--no-warmup", *NO_PIN),
                      rf"pushdown: [\d.]+x faster, 3 records read {MODE}",
                      spark=True, server=True),
    "fanout": Smoke(("--users", "10", "--events", N, "--rows-per-batch", N,
                     "--warmup-events", "0", *NO_PIN),
                    r"fanout \(300 events, 300 a micro-batch, 2 partitions\): [\d.]+x one "
                    rf"stream at 10 users \(.*\) {MODE}", spark=True, server=True),
    "durable_spark_read": Smoke(("--messages", N, "--repeat", "1", "--no-warmup", *NO_PIN),
                                r"durable_spark_read: \d+ rows/s, [\d.]+x in-memory Arrow "
                                rf"source, server [\d.]+ CPU s per 1M messages {MODE}",
                                spark=True),
    "durable_spark_write": Smoke(("--rows", "150", "--rows-per-batch", "150",
                                  "--peer-messages", "100", "--threads", "4", *NO_PIN),
                                 r"durable_spark_write: \d+ rows/s, [\d.]+x durable-streams "
                                 rf"\(PyPI\) {MODE}", spark=True),
    "latency": Smoke(("--duration", "0.5", "--interval", "50", "--warmup", "0", "--rounds", "1",
                      "--min-records", "1", *NO_PIN),
                     r"latency: p50 \d+ ms, p99 \d+ ms, [\d.]+x floor p50, [\d.]+x floor "
                     rf"p99 {MODE}", spark=True, server=True),
    "many_streams": Smoke(("--streams", "20", "--records", "5", "--idle-streams", "20",
                           "--repeat", "1", "--no-warmup", "--settle", "0.3", "--window",
                           "0.3", "--duration", "0.5", "--warmup", "0.2", *NO_PIN),
                          r"many_streams: read [\d.]+x single at 20x5; write [\d.]+x single "
                          rf"at 20x5; idle .* req/s per stream, p50 .*x single {MODE}",
                          spark=True, server=True),
    "planner_imports": Smoke(("--runs", "1", "--no-warmup"),
                             r"planner_imports durable-streams: source \+\d+ ms .*peer\)"),
    "microbatch_cost": Smoke(("--batches", "1", "--warm-up", "1", "--trigger-ms", "100",
                              "--rounds", "1", *NO_PIN),
                             r"microbatch_cost: sink Python CPU [\d.]+x trivial-sink \([\d.]+x "
                             r"frozen\), JVM [\d.]+x; source Python CPU [\d.]+x trivial-source "
                             r"\([\d.]+x frozen\), JVM [\d.]+x "
                             + MODE, spark=True, server=True),
    # `--servers` (the module's server is added) and no Kafka; every part but eos
    # (KAFKA_COMPARE_EOS says why).
    "kafka_compare": Smoke(("--no-kafka", "--parts", "read,write,fanout,latency",
                            "--records", "200", "--shapes", "100h", "--per-trigger", "100",
                            "--users", "10", "--fan-events", "200", "--fan-per-trigger",
                            "100", "--intervals", "50", "--latency-seconds", "0.5",
                            "--latency-settle", "0", "--latency-drain", "0", "--warmup", "0",
                            *NO_PIN),
                           r"kafka_compare: s2 \(http://127\.0\.0\.1:\d+\) n/a Kafka "
                           rf"\(geometric mean of 0 ratios\) {MODE}", spark=True),
}


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(SMOKE), "a benchmark without a smoke run here, or one gone"


@pytest.fixture(scope="module")
def on_path() -> Iterator[None]:
    """benchmarks/ importable, after everything else (for the `_*` helpers and the
    benchmarks' imports of each other: `from latency import ...`)."""
    sys.path.append(str(BENCHMARKS))
    try:
        yield
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def s2_url() -> Iterator[str]:
    """One local S2 server process for the S2 benchmarks of this module."""
    from s2_spark.testing import ServerProcess

    with ServerProcess() as server:
        yield server.url


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py as module `benchmarks_smoke_<name>`, every module of
    benchmarks/ then loaded pickled by value."""
    from pyspark import cloudpickle

    module_name = f"benchmarks_smoke_{name}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    for loaded in list(sys.modules.values()):
        path = getattr(loaded, "__file__", None)
        if path is not None and Path(path).parent == BENCHMARKS:
            cloudpickle.register_pickle_by_value(loaded)
    return module


@pytest.fixture
def kept_process() -> Iterator[None]:
    """This process as it was after a benchmark: its environment (durable_spark_read
    sets PYTHONPATH for Spark's workers), its open-files limits (idle_reader and
    many_streams leave files to the server), the wire codecs' builds (wire_builds points
    them at builds of its own)."""
    from s2_spark.wire import appends, durable, records

    env = dict(os.environ)
    files = resource.getrlimit(resource.RLIMIT_NOFILE)
    codecs = (records._fastwire, appends._fastwire, durable._fastjson)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        # (a hard limit lowered for good, without the privilege to raise it, stays so)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, files)
        (records._fastwire, appends._fastwire,  # type: ignore[attr-defined]
         durable._fastjson) = codecs  # type: ignore[attr-defined]


def run(name: str, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Run benchmark `name` at smoke size and check its last line."""
    smoke = SMOKE[name]
    argv = list(smoke.args)
    if smoke.server:
        argv += ["--server", url]
    elif name == "kafka_compare":
        argv += ["--servers", url]
    load(name).main(argv)
    out = capsys.readouterr().out
    sys.stdout.write(out)  # shown with the test's report if it fails
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, f"{name} printed nothing"
    assert re.fullmatch(smoke.last, lines[-1]), (
        f"{name}'s last line is not its summary: {lines[-1]!r}")


@pytest.mark.parametrize("name", [n for n, s in SMOKE.items() if not s.spark])
def test_benchmark_runs(name: str, on_path: None, kept_process: None, s2_url: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    run(name, s2_url, capsys)


@pytest.mark.spark
@pytest.mark.parametrize("name", [n for n, s in SMOKE.items() if s.spark])
def test_spark_benchmark_runs(name: str, on_path: None, kept_process: None, s2_url: str,
                              spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        run(name, s2_url, capsys)
    finally:
        lender = sys.modules.get("_spark")  # benchmarks/_spark.py
        if lender is not None and id(spark) in lender._LENT:  # it failed before giving
            lender.stop_session(spark)  # the session back: its settings put back here
    assert spark.sparkContext._jsc is not None, f"{name} stopped the session it was lent"
    assert not spark.streams.active, f"{name} left a query running"
