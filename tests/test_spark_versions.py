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


@pytest.mark.skipif(VERSION >= (4, 2), reason="streaming durable-streams reads need 4.2")
def test_durable_streams_read_stream_fails_before_4_2(spark: Any, ds_server: Any) -> None:
    from s2_spark.durable import DurableStreamsClient

    url = f"{ds_server.url}/versions/events"
    with DurableStreamsClient() as client:
        client.stream(url).create("application/json")
        client.stream(url).append_json(["one"])
    df = spark.readStream.format("durable-streams").option("url", url).load()
    with pytest.raises(Exception, match=r"needs PySpark 4\.2 or newer") as info:
        df.writeStream.format("noop").start().awaitTermination(60)
    assert f"this is PySpark {spark_version}" in str(info.value)
    # Batch reads work on every PySpark 4.x.
    rows = spark.read.format("durable-streams").option("url", url).load().collect()
    assert [r.value for r in rows] == ['"one"']
