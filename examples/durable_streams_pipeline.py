"""Durable Streams in and out of Spark: a checkpointed, exactly-once pipeline.

Reads a JSON stream of orders with `spark.readStream.format("durable-streams")`, keeps the
large ones, and appends them to another stream with `writeStream.format("durable-streams")`
(idempotent producer: exactly-once across retries and restarts). Run twice on the same
checkpoint, with more orders appended in between, it copies only what is new.

    python examples/durable_streams_pipeline.py --base-url http://127.0.0.1:4437

Without --base-url it starts the Durable Streams reference server from this repository's
test bed (`npm install --prefix tests/durable_server` first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

# Spark's Python workers must run this interpreter (the one with s2-spark installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from s2_spark.durable import DurableStreamsClient


@contextlib.contextmanager
def server(base_url: str | None) -> Iterator[str]:
    """The given server, or the reference server from tests/durable_server."""
    if base_url:
        yield base_url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from durable_testbed import DurableServer

    with DurableServer() as local:
        yield local.url


def copy_large_orders(spark: SparkSession, source: str, target: str, checkpoint: str) -> None:
    """One AvailableNow run: orders of 100 or more, as JSON text, into `target`."""
    orders = (
        spark.readStream.format("durable-streams").option("url", source).load()
        .select(F.from_json("value", "id long, amount double").alias("o"))
        .where("o.amount >= 100")
        .select(F.to_json(F.struct("o.id", "o.amount")).alias("value"))
    )
    query = (
        orders.writeStream.format("durable-streams").option("url", target)
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    )
    query.awaitTermination()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", help="a running Durable Streams server")
    args = ap.parse_args()
    spark = (
        SparkSession.builder.master("local[2]").appName("durable-streams-example")
        .config("spark.ui.enabled", "false").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    run = uuid.uuid4().hex[:8]
    with server(args.base_url) as base, DurableStreamsClient(base_url=base) as client:
        source, target = f"{base}/example-{run}/orders", f"{base}/example-{run}/large"
        client.stream(source).create("application/json")
        client.stream(target).create("application/json")
        checkpoint = tempfile.mkdtemp(prefix="durable-example-")
        client.stream(source).append_json([{"id": i, "amount": 40 * i} for i in range(5)])
        copy_large_orders(spark, source, target, checkpoint)
        client.stream(source).append_json([{"id": i, "amount": 40 * i} for i in range(5, 8)])
        copy_large_orders(spark, source, target, checkpoint)  # only the new orders
        copied = [m for chunk in client.stream(target).read("-1") for m in chunk.messages()]
        print("large orders:", json.dumps(copied))
    spark.stop()


if __name__ == "__main__":
    main()
