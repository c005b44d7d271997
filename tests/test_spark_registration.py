"""Installing s2-spark is enough: Spark finds formats "s2" and "durable-streams" with no
register() call.

Runs in a fresh process because the shared test SparkSession registers the source itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

from s2_spark.durable import DurableStreamsClient
from s2_spark.s2 import AppendRecord, S2Client, S2Config

SCRIPT = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession

    url, basin, stream = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[1]").appName("s2-registration")
             .config("spark.ui.enabled", "false").getOrCreate())
    rows = (spark.read.format("s2").option("endpoint", url).option("basin", basin)
            .option("stream", stream).option("includeHeaders", "false").load()
            .orderBy("seq_num").collect())
    print("ROWS", [(r.seq_num, bytes(r.body).decode()) for r in rows])
    rows = spark.read.format("durable-streams").option("url", sys.argv[4]).load().collect()
    print("MESSAGES", [r.value for r in rows])
    spark.stop()
    """
)


def test_formats_are_found_without_registering(
    s2_server: Any, ds_server: Any, unique: Any, tmp_path: Any
) -> None:
    basin, stream = unique("registration"), "events"
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream(stream)
        client.basin(basin).stream(stream).append([AppendRecord(b"one"), AppendRecord(b"two")])
    ds_url = f"{ds_server.url}/registration/{unique('events')}"
    with DurableStreamsClient() as ds:
        ds.stream(ds_url).create("application/json")
        ds.stream(ds_url).append_json([{"a": 1}, "two"])
    script = tmp_path / "read.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(script), s2_server.url, basin, stream, ds_url],
        cwd=tmp_path,  # not the repository root: discovery must come from the install
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS [(0, 'one'), (1, 'two')]" in done.stdout
    assert """MESSAGES ['{"a":1}', '"two"']""" in done.stdout
