"""A fan-out written by the previous release, killed mid-micro-batch, goes on under this one.

`tests/data/writer-0.1/` holds what release 0.1 (commit 7bdce88, the lease protocol: one
fence record per append holding the writer's lease, partitions taking turns) left when
its streaming query was SIGKILLed with a task hung after its 12th append of micro-batch
1: the local server's data directory (the source stream of events and the user streams
written so far, with 0.1's fence records and tokens) and the query's checkpoint. This
version restarts the query from that checkpoint against that data: every user's stream
must hold each of its events exactly once.

To write the data again with a checkout of 0.1 (only ever needed if it is lost):
`PYTHONPATH=<checkout of 7bdce88> python tests/test_s2_writer_compat.py`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

DATA = Path(__file__).resolve().parent / "data" / "writer-0.1"
SRC, DST = "compat-src", "compat-dst"
N, USERS, PER_TRIGGER = 1200, 60, 400


def _events() -> list[bytes]:
    return [f"{(i * 7919) % USERS:03d}:{i}".encode() for i in range(N)]


def _user_streams(url: str) -> dict[int, list[int]]:
    from s2_spark.errors import NotFoundError
    from s2_spark.s2 import S2Client, S2Config

    out: dict[int, list[int]] = {}
    with S2Client(S2Config(endpoint=url)) as client:
        for u in range(USERS):
            stream = client.basin(DST).stream(f"u/{u:03d}")
            try:
                tail = stream.check_tail().seq_num
            except NotFoundError:
                out[u] = []
                continue
            got: list[int] = []
            pos = 0
            while pos < tail:
                d = stream.read(seq_num=pos, count=1000, include_command_records=False)
                got += [int(b.split(b":")[1]) for b in d.batch.column("body").to_pylist()]
                pos = int(d.last_seq_num) + 1
            out[u] = got
    return out


def _query(spark: Any, url: str, checkpoint: str, fault: str | None = None) -> Any:
    from pyspark.sql import functions as F

    df = (spark.readStream.format("s2").option("endpoint", url).option("basin", SRC)
          .option("stream", "events").option("minPartitions", "2")
          .option("maxRecordsPerTrigger", str(PER_TRIGGER)).load())
    routed = df.select(
        F.concat(F.lit("u/"), F.substring(F.col("body").cast("string"), 1, 3)).alias("stream"),
        "body")
    w = (routed.writeStream.format("s2").option("endpoint", url).option("basin", DST)
         .option("createStreams", "true").option("checkpointLocation", checkpoint)
         .trigger(availableNow=True))
    if fault is not None:
        w = w.option("_testFaultAfterAppends", fault)
    return w.start()


def test_a_fanout_killed_under_the_previous_release_goes_on_exactly_once(spark: Any) -> None:
    from s2_spark.testing import ServerProcess

    work = Path(tempfile.mkdtemp(prefix="s2-writer-compat-"))
    shutil.copytree(DATA, work / "copy")
    server = ServerProcess(data_dir=work / "copy" / "server").start()
    try:
        before = _user_streams(server.url)
        written = sum(len(v) for v in before.values())
        assert PER_TRIGGER < written < 2 * PER_TRIGGER  # micro-batch 1 stopped part way
        q = _query(spark, server.url, str(work / "copy" / "checkpoint"))
        assert q.awaitTermination(240), "the query did not finish"
        assert q.exception() is None, str(q.exception())
        after = _user_streams(server.url)
    finally:
        server.stop()
    for u in range(USERS):
        want = [i for i in range(N) if (i * 7919) % USERS == u]
        assert sorted(after[u]) == want, u
        assert after[u][:len(before[u])] == before[u], u


CHILD = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    tests, url, checkpoint, fault = sys.argv[1:5]
    sys.path.insert(0, tests)
    from pyspark.sql import SparkSession
    from test_s2_writer_compat import _query
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    _query(spark, url, checkpoint, fault).awaitTermination()
""")


def main() -> None:
    """Write tests/data/writer-0.1 with the s2_spark importable now (meant: release 0.1)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _child import kill_at_marker

    from s2_spark.s2 import AppendRecord, S2Client, S2Config
    from s2_spark.testing import ServerProcess

    work = Path(tempfile.mkdtemp(prefix="s2-writer-compat-"))
    server = ServerProcess(data_dir=work / "server").start()
    try:
        with S2Client(S2Config(endpoint=server.url)) as client:
            client.create_basin(SRC)
            client.create_basin(DST)
            client.basin(SRC).create_stream("events")
            client.basin(SRC).stream("events").append_many([AppendRecord(b)
                                                            for b in _events()])
        script = work / "child.py"
        script.write_text(CHILD)
        marker = str(work / "killed")
        kill_at_marker([sys.executable, str(script), str(Path(__file__).parent), server.url,
                        str(work / "checkpoint"), f"hang:12:1:{marker}"], marker)
        print({u: len(v) for u, v in _user_streams(server.url).items()})
    finally:
        server.stop()
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    shutil.copytree(work / "server", DATA / "server")
    shutil.copytree(work / "checkpoint", DATA / "checkpoint")
    print("written", DATA, "with", os.environ.get("PYTHONPATH"))


if __name__ == "__main__":
    main()
