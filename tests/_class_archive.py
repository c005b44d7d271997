"""A class-data-sharing archive of what a Spark JVM loads, so that the suite's Spark
starts cost half the CPU.

A local Spark driver (the session's, each kill test's child, each restarted query's)
spends about 19 s of CPU starting and running its first query on this project's 2-core
machines, half of it loading and verifying Spark's classes from its jars; with a JDK
dynamic archive of those classes mapped in, about 9 s. The suite starts dozens of drivers,
and clusters of masters, workers and executors.

The archive is made once per JDK, PySpark install and jar set (the JDK refuses an archive
whose jars changed), by one throwaway driver that runs a batch query and a streaming query
through the benchmarks' trivial Python source and Arrow sink, and kept in the cache folder
of the external servers (`s2_spark.testing.external.cache_root`). `start_archive` makes it
in the background: the README's test command starts it before its checks (`python
tests/_class_archive.py`), and the suite starts it where it is missing; either way the
suite waits for it before its first driver starts (`await_archive`). `use_archive`
hands it to every JVM started once it is there (`JAVA_TOOL_OPTIONS`). The JDK maps it
only under the class path it was made with, whose head is Spark's conf folder: every
Spark JVM of the suite gets the same empty one (`conf_dir`). A JVM with another class
path does not use it, silently; nothing else changes. `S2_SPARK_CLASS_ARCHIVE=0` turns it off.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

SWITCH = "S2_SPARK_CLASS_ARCHIVE"
#: The JVMs of the suite live a minute or two on small data: the client compiler alone and
#: one GC thread spend a quarter less CPU on its 2 cores (tests/test_spark_writer.py: 80 s
#: against 105 s). Set for every JVM the tests start, the archive's maker included.
LIGHT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: The JDK's messages about an archive it cannot use (another class path) stay quiet: a
#: driver's standard output can be what a test reads.
_QUIET = "-Xlog:cds=off,cds+dynamic=off"


def archive_path() -> Path | None:
    """Where the archive for this JDK, PySpark and jar set is kept; None where Java or
    PySpark is missing or the archive is switched off."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    try:
        import pyspark

        env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}
        java = subprocess.run(["java", "-version"], capture_output=True, text=True,
                              env=env, timeout=60).stderr
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256(java.encode())
    for jar in sorted(jars.glob("*.jar")):
        st = jar.stat()
        key.update(f"{jar}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    from s2_spark.testing.external import cache_root

    return cache_root() / "class-archives" / f"spark-{key.hexdigest()[:20]}.jsa"


def start_archive(path: Path) -> subprocess.Popen[bytes] | None:
    """Start making the archive at `path` in the background unless it is there (one
    maker at a time: the others return at once); the process."""
    if path.exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    # Its own session: it finishes even if the run that started it ends first (a later
    # run would otherwise start it again); a lock keeps it to one at a time.
    with open(path.with_suffix(".log"), "wb") as log:
        return subprocess.Popen([sys.executable, __file__, str(path)], start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def await_archive(path: Path, maker: subprocess.Popen[bytes] | None = None,
                  timeout: float = 180.0) -> bool:
    """Wait, up to `timeout` seconds, for `maker` or any other maker at work on `path`
    (its lock held) to finish; whether the archive is there. The test command starts one
    just before the checks, which can end first on a fresh checkout: the session drivers
    pytest then starts ran the whole suite without it (a fresh clone's tests took 715-826 s
    against 645-660 s in the same tree once the archive was there)."""
    deadline = time.monotonic() + timeout
    if maker is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            maker.wait(timeout)
    while not path.exists() and time.monotonic() < deadline:
        try:
            with open(f"{path}.lock") as lock:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            break  # no maker at work
        except FileNotFoundError:
            break  # none ever started
        except BlockingIOError:
            time.sleep(0.2)  # a maker holds it: the archive comes when it exits
    return path.exists()


def conf_dir(path: Path) -> Path:
    """The Spark conf folder of every JVM the archive at `path` serves: an empty one of
    its own. It heads the class path of drivers, masters, workers and executors alike, and
    the JDK maps an archive only under the class path it was made with."""
    folder = path.parent / "conf"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def use_archive(path: Path) -> bool:
    """Hand the archive at `path` to the JVMs this process and its children start from
    now on (`JAVA_TOOL_OPTIONS`), once it is there; whether they get it. A JVM with another
    class path (a spark-submit's launcher, Kafka) maps nothing and says nothing."""
    opts = os.environ.get("JAVA_TOOL_OPTIONS", "")
    if str(path) in opts:
        return True
    if not path.exists():
        return False
    os.environ["JAVA_TOOL_OPTIONS"] = f"{opts} -XX:SharedArchiveFile={path} {_QUIET}".strip()
    return True


#: The benchmarks' trivial Python source and sink (`benchmarks/_trivial.py`, only pyspark's
#: imports), the archive's workload: Spark's workers unpickle them from this folder.
_TRIVIAL = Path(__file__).resolve().parent.parent / "benchmarks"


def _make(path: Path) -> None:
    """Run the throwaway driver with the archive written at its exit, then move the
    archive into place (an interrupted run leaves none)."""
    import tempfile

    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    lock = open(f"{path}.lock", "w")  # noqa: SIM115 - held until this process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another run is making it
    partial = path.with_suffix(f".{os.getpid()}.partial")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["JAVA_TOOL_OPTIONS"] = LIGHT_JVM
    os.environ.setdefault("SPARK_CONF_DIR", str(conf_dir(path)))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_TRIVIAL), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(_TRIVIAL))
    from _trivial import TrivialSink, TrivialSource
    spark = (SparkSession.builder.master("local[2]").appName("class-archive")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.extraJavaOptions",
                     f"-XX:ArchiveClassesAtExit={partial} {_QUIET}")
             .getOrCreate())
    spark.dataSource.register(TrivialSource)
    spark.dataSource.register(TrivialSink)
    spark.range(100).selectExpr("id % 7 AS k").groupBy("k").count().toArrow()
    with tempfile.TemporaryDirectory() as ckpt:
        q = (spark.readStream.format("trivial-source").load().writeStream
             .format("trivial-sink").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination(300)
    spark.stop()
    # The JVM leaves when its standard input ends, and writes the archive as it goes.
    proc = SparkContext._gateway.proc  # type: ignore[union-attr]
    proc.stdin.close()
    proc.wait(300)
    if partial.exists():
        partial.rename(path)


if __name__ == "__main__":
    if len(sys.argv) > 1:  # the maker itself
        _make(Path(sys.argv[1]))
    elif (where := archive_path()) is not None:  # the test command, before the checks
        start_archive(where)
