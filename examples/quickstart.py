"""Quickstart: S2 streams in and out of Spark Structured Streaming, no account needed.

Starts the local S2-compatible server, writes a few records with the client, reads them
with `spark.readStream.format("s2")` into a checkpointed query, appends more and shows
that the restarted query continues exactly where it stopped. Then a second query copies
the stream, upper-cased, into another stream with `writeStream.format("s2")` (exactly-once)
and the client reads the copy back.

    pip install "s2-spark[server]"    # the local server needs hypercorn
    python examples/quickstart.py
"""

from __future__ import annotations

import os
import sys
import tempfile

# Spark's Python workers must run this interpreter (the one with s2-spark installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import DataFrame, SparkSession

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing import LocalS2Server


def write(client: S2Client, basin: str, stream: str, bodies: list[str]) -> None:
    ack = client.basin(basin).stream(stream).append(
        [AppendRecord(body.encode(), headers=[(b"source", b"quickstart")]) for body in bodies]
    )
    print(f"appended seq_nums [{ack.start.seq_num}, {ack.end.seq_num}) to {stream!r}")


def run_once(spark: SparkSession, url: str, basin: str, stream: str, checkpoint: str) -> None:
    """Read everything available now, print it, stop; the checkpoint remembers where."""
    df = (
        spark.readStream.format("s2")
        .option("endpoint", url)
        .option("basin", basin)
        .option("stream", stream)
        .option("startingPosition", "earliest")
        .load()
    )

    def show(batch: DataFrame, batch_id: int) -> None:
        for row in batch.orderBy("seq_num").collect():
            print(f"  batch {batch_id}: seq_num={row.seq_num} body={bytes(row.body).decode()!r} "
                  f"headers={[(bytes(h.name), bytes(h.value)) for h in row.headers]}")

    query = (
        df.writeStream.foreachBatch(show)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def copy_upper(spark: SparkSession, url: str, basin: str, source: str, target: str,
               checkpoint: str) -> None:
    """S2 -> Spark -> S2: upper-case every body into another stream, exactly-once."""
    query = (
        spark.readStream.format("s2")
        .option("endpoint", url)
        .option("basin", basin)
        .option("stream", source)
        .load()
        .selectExpr("CAST(upper(CAST(body AS STRING)) AS BINARY) AS body", "headers")
        .writeStream.format("s2")
        .option("endpoint", url)
        .option("basin", basin)
        .option("stream", target)
        .option("createStreams", "true")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def main() -> int:
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("s2-spark-quickstart")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    # Installing s2-spark registers format "s2" (module pyspark_s2): no register() call.
    basin, stream = "quickstart-basin", "events"
    with LocalS2Server() as server, S2Client(S2Config(endpoint=server.url)) as client, \
            tempfile.TemporaryDirectory() as tmp:
        client.create_basin(basin)
        client.basin(basin).create_stream(stream)
        checkpoint = os.path.join(tmp, "checkpoint")

        write(client, basin, stream, ["hello", "from", "s2"])
        print("first run:")
        run_once(spark, server.url, basin, stream, checkpoint)

        write(client, basin, stream, ["and", "more"])
        print("second run (same checkpoint: only the new records):")
        run_once(spark, server.url, basin, stream, checkpoint)

        target = f"{stream}-upper"
        copy_upper(spark, server.url, basin, stream, target, os.path.join(tmp, "copy"))
        copied = client.basin(basin).stream(target).read(seq_num=0, include_command_records=False)
        print(f"copied into {target!r} by writeStream.format('s2'):")
        for row in copied.batch.to_pylist():
            headers = [(h["name"], h["value"]) for h in row["headers"]]
            print(f"  body={row['body'].decode()!r} headers={headers}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
