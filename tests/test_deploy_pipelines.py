"""The Spark Declarative Pipelines example runs with `spark-pipelines run` as shipped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from _deploy import SPARK_HOME, spark_env

from s2_spark.s2 import AppendRecord, S2Client, S2Config

pytestmark = [
    pytest.mark.connect,  # spark-pipelines runs its own Spark Connect server
    pytest.mark.skipif(
        not (SPARK_HOME / "bin" / "spark-pipelines").exists(),
        reason="Spark Declarative Pipelines (spark-pipelines) arrived in PySpark 4.1",
    ),
]

PROJECT = Path(__file__).resolve().parent.parent / "examples" / "pipeline"


def test_pipeline_streaming_table_over_s2(s2_server: Any, unique: Any, tmp_path: Path) -> None:
    basin = unique("pipeline")
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream("events")
        client.basin(basin).stream("events").append(
            [AppendRecord(b) for b in (b"one", b"two", b"three")])

    import yaml  # spark-pipelines' own dependency: installed where PySpark 4.1+ is

    project = tmp_path / "pipeline"
    shutil.copytree(PROJECT, project)
    spec_path = project / "spark-pipeline.yml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["storage"] = (tmp_path / "storage").as_uri()
    spec["configuration"].update({"s2.endpoint": s2_server.url, "s2.basin": basin})
    spec_path.write_text(yaml.safe_dump(spec))

    done = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-pipelines"), "run", "--spec", str(spec_path)],
        cwd=tmp_path, env=spark_env(tmp_path), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])

    table = pq.read_table(tmp_path / "spark-warehouse" / "s2_events").sort_by("seq_num")
    assert table.select(["seq_num", "body"]).to_pylist() == [
        {"seq_num": 0, "body": "one"}, {"seq_num": 1, "body": "two"},
        {"seq_num": 2, "body": "three"},
    ]
