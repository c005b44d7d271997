"""A cluster job: copy S2 streams into another basin, exactly-once, restartable.

Every record available now is copied (`trigger(availableNow=True)`), then the job exits;
run it again with the same checkpoint and it copies only what arrived since. Each source
stream keeps its name and its order in the target basin. Submit it to any cluster whose
nodes all have s2-spark installed:

    spark-submit --master spark://HOST:7077 examples/cluster_job.py \\
        --endpoint http://s2-lite:8080 --source-basin src --streams a,b \\
        --target-basin dst --checkpoint hdfs:///checkpoints/s2-copy

(For s2.dev, leave out --endpoint and set S2_ACCESS_TOKEN on the driver.) The checkpoint
must be on storage the driver can reach after a restart (HDFS, S3, a shared disk).
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import SparkSession


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", help="s2-lite or local server URL; default: s2.dev")
    parser.add_argument("--source-basin", required=True)
    parser.add_argument("--streams", required=True, help="comma-separated source streams")
    parser.add_argument("--target-basin", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-records-per-append", default="999")
    parser.add_argument("--max-appends-in-flight", default="16")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    spark = SparkSession.builder.appName("s2-copy").getOrCreate()
    connection = {"endpoint": args.endpoint} if args.endpoint else {}
    source = (
        spark.readStream.format("s2")  # found because s2-spark is installed: no register()
        .options(**connection)
        .option("basin", args.source_basin)
        .option("streams", args.streams)
        .option("startingPosition", "earliest")
        .load()
    )
    query = (
        source.writeStream.format("s2")  # rows go to the stream named in their `stream` column
        .options(**connection)
        .option("basin", args.target_basin)
        .option("createStreams", "true")
        .option("maxRecordsPerAppend", args.max_records_per_append)
        .option("maxAppendsInFlight", args.max_appends_in_flight)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    rows = sum(progress["numInputRows"] for progress in query.recentProgress)
    print(f"copied {rows} records")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
