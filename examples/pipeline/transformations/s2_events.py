"""A streaming table fed by an S2 stream: one row per record, appended incrementally.

spark-pipelines imports this file with `spark` already defined in its namespace.
"""
# ruff: noqa: F821

from pyspark import pipelines as dp
from pyspark.sql import DataFrame


@dp.table(comment="Records of the S2 stream named in the pipeline configuration.")
def s2_events() -> DataFrame:
    conf = spark.conf
    reader = spark.readStream.format("s2").option("basin", conf.get("s2.basin"))
    if conf.get("s2.endpoint", None):
        reader = reader.option("endpoint", conf.get("s2.endpoint"))
    return (
        reader.option("stream", conf.get("s2.stream"))
        .option("startingPosition", "earliest")
        .load()
        .selectExpr("seq_num", "timestamp", "CAST(body AS STRING) AS body")
    )
