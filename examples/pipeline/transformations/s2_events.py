"""A streaming table fed by an S2 stream: one row per record, appended incrementally."""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession


@dp.table(comment="Records of the S2 stream named in the pipeline configuration.")
def s2_events() -> DataFrame:
    # The pipeline's session (spark-pipelines of PySpark 4.1 does not define `spark` in
    # this module's namespace; 4.2+ does).
    spark = SparkSession.active()
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
