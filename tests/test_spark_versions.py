"""Features that need a newer PySpark are found by what the API offers, and an option that
needs one fails at `load()` on an older Spark, naming the option and the version."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark import __version__ as spark_version

from s2_spark.spark._compat import HAS_ADMISSION_CONTROL, HAS_STREAM_ARROW_WRITER

pytestmark = pytest.mark.spark

VERSION = tuple(int(part) for part in spark_version.split(".")[:2])


def test_features_match_the_spark_version() -> None:
    assert (VERSION >= (4, 1)) == HAS_STREAM_ARROW_WRITER
    assert (VERSION >= (4, 2)) == HAS_ADMISSION_CONTROL


def _load_with_limit(spark: Any, s2_server: Any) -> Any:
    return (
        spark.readStream.format("s2")
        .option("endpoint", s2_server.url)
        .option("basin", "any-basin")
        .option("stream", "events")
        .option("maxRecordsPerTrigger", "10")
        .load()
    )


@pytest.mark.skipif(VERSION >= (4, 2), reason="admission control exists from PySpark 4.2")
def test_max_records_per_trigger_fails_at_load_before_4_2(spark: Any, s2_server: Any) -> None:
    with pytest.raises(Exception, match="OptionError") as info:
        _load_with_limit(spark, s2_server)
    assert (
        f"option maxRecordsPerTrigger needs PySpark 4.2 or newer (admission control for "
        f"Python streaming sources); this is PySpark {spark_version}"
    ) in str(info.value)


@pytest.mark.skipif(VERSION < (4, 2), reason="admission control needs PySpark 4.2")
def test_max_records_per_trigger_loads_from_4_2(spark: Any, s2_server: Any) -> None:
    assert _load_with_limit(spark, s2_server).isStreaming


def test_durable_streams_read_stream_restarts_exactly_on_every_4x(
    spark: Any, ds_server: Any, tmp_path: Any
) -> None:
    """Before 4.2 Spark does not hand a restarted query's start to `latestOffset()`: the
    positions ({offset, skip}) need none, so a restart reads exactly what is new."""
    import uuid

    from s2_spark.durable import DurableStreamsClient

    url = f"{ds_server.url}/versions/{uuid.uuid4().hex[:8]}"
    got: list[list[str]] = []

    def run() -> None:
        df = spark.readStream.format("durable-streams").option("url", url).load()
        q = (df.writeStream.trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .foreachBatch(lambda b, _: got.append([r.value for r in b.collect()])).start())
        q.awaitTermination(120)
        assert q.exception() is None

    with DurableStreamsClient() as client:
        client.stream(url).create("application/json")
        client.stream(url).append_json(["one", "two"])
        run()
        client.stream(url).append_json(["three"])
        run()
    assert [b for b in got if b] == [['"one"', '"two"'], ['"three"']]
