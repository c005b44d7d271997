"""Lag as Prometheus metrics: a LagListener's latest lag on a text endpoint, no metrics
library needed.

Starts the local S2-compatible server, fills two streams with a backlog and reads them
with a streaming query paced by maxRecordsPerTrigger (PySpark 4.2+), so the lag drains
over a few triggers. `s2_spark.LagListener` logs one line per trigger and keeps the latest
lag per query; a standard-library HTTP server renders it in Prometheus's text exposition
format at /metrics:

    s2_spark_lag_records{query="lag-demo",format="s2",stream="events-a"} 0
    s2_spark_query_lag_records{query="lag-demo"} 0

Once the backlog is read, the example prints a scrape of its own endpoint, serves it for
--serve-seconds more (point Prometheus or curl at it) and stops.

    pip install "s2-spark[server]"
    python examples/lag_metrics.py --serve-seconds 60 --port 9464
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Spark's Python workers must run this interpreter (the one with s2-spark installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from s2_spark import LagListener, QueryLag
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing import LocalS2Server

BACKLOG = {"events-a": 250, "events-b": 50}
PER_TRIGGER = 100
#: maxRecordsPerTrigger, and latestOffset in progress for Python sources, need 4.2+.
PACED = tuple(int(p) for p in pyspark.__version__.split(".")[:2]) >= (4, 2)

_METRICS = (
    ("s2_spark_lag_records", "Records (S2; Durable Streams: messages or bytes) a stream "
     "is behind the latest tail its query planned with."),
    ("s2_spark_lag_behind", "1 if a stream is behind its latest planned tail, else 0."),
    ("s2_spark_query_lag_records", "Records behind over all streams of a query."),
    ("s2_spark_query_streams_behind", "Streams of a query behind their tails."),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(lags: Iterable[QueryLag]) -> str:
    """Prometheus text format (0.0.4) for the given lags; unknown values are left out."""
    samples: dict[str, list[str]] = {name: [] for name, _ in _METRICS}
    for lag in lags:
        query = f'query="{_label(lag.name or lag.query_id)}"'
        for source in lag.sources:
            for s in source.streams.values():
                labels = f'{query},format="{source.format}",stream="{_label(s.stream)}"'
                if s.records is not None:
                    samples["s2_spark_lag_records"].append(f"{{{labels}}} {s.records}")
                if s.behind is not None:
                    samples["s2_spark_lag_behind"].append(f"{{{labels}}} {int(s.behind)}")
        if lag.total is not None:
            samples["s2_spark_query_lag_records"].append(f"{{{query}}} {lag.total}")
        if lag.behind is not None:
            samples["s2_spark_query_streams_behind"].append(f"{{{query}}} {lag.behind}")
    lines = []
    for name, help_text in _METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [name + sample for sample in samples[name]]
    return "\n".join(lines) + "\n"


def serve_metrics(listener: LagListener, port: int) -> ThreadingHTTPServer:
    """/metrics on 127.0.0.1:`port` (0: a free port), served from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = exposition(listener.lag.values()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # no access log on stderr

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def fill(url: str, basin: str) -> None:
    with S2Client(S2Config(endpoint=url)) as client:
        client.create_basin(basin)
        for stream, count in BACKLOG.items():
            client.basin(basin).create_stream(stream)
            client.basin(basin).stream(stream).append(
                [AppendRecord(f"{stream} #{i}".encode()) for i in range(count)])


def wait_for_batch(listener: LagListener, query: StreamingQuery, batch_id: int) -> None:
    """Until the listener has the lag of micro-batch `batch_id` (events come after it)."""
    deadline = time.monotonic() + 60
    while (seen := listener.latest(query.id)) is None or (seen.batch_id or 0) < batch_id:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the listener saw no progress of micro-batch {batch_id}")
        time.sleep(0.05)


def scrape(metrics: str, when: str) -> None:
    with urllib.request.urlopen(metrics) as answer:
        print(f"scrape of {metrics} {when}:\n{answer.read().decode()}", end="", flush=True)


def run(spark: SparkSession, url: str, basin: str, listener: LagListener, metrics: str,
        serve_seconds: float) -> None:
    """Read the backlog; the sink holds the second micro-batch until the first scrape
    (a slow sink would, for longer), so that scrape sees the query behind."""
    scraped = threading.Event()

    def sink(batch: DataFrame, batch_id: int) -> None:
        if batch_id == 1:
            scraped.wait(60)

    df = (spark.readStream.format("s2").option("endpoint", url).option("basin", basin)
          .option("streams", ",".join(BACKLOG)).option("startingPosition", "earliest"))
    if PACED:
        df = df.option("maxRecordsPerTrigger", str(PER_TRIGGER))
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (df.load().writeStream.foreachBatch(sink).queryName("lag-demo")
                 .option("checkpointLocation", checkpoint).start())
        try:
            wait_for_batch(listener, query, 0)
            scrape(metrics, "after the first micro-batch")
            scraped.set()
            query.processAllAvailable()
            wait_for_batch(listener, query, query.lastProgress["batchId"])
            scrape(metrics, "once caught up")
            time.sleep(serve_seconds)
        finally:
            scraped.set()
            query.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve-seconds", type=float, default=0.0,
                        help="how long to go on serving /metrics once caught up")
    parser.add_argument("--port", type=int, default=0, help="metrics port (0: a free one)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stdout, format="%(name)s: %(message)s")
    logging.getLogger("s2_spark.lag").setLevel(logging.INFO)
    if not PACED:
        print(f"PySpark {pyspark.__version__}: no maxRecordsPerTrigger and no latestOffset "
              "for Python sources before 4.2, so the lag is unknown and left out")

    spark = (SparkSession.builder.master("local[2]").appName("s2-spark-lag-metrics")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    listener = LagListener()
    spark.streams.addListener(listener)
    server = serve_metrics(listener, args.port)
    metrics = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    print(f"serving {metrics}", flush=True)
    try:
        with LocalS2Server() as s2:
            fill(s2.url, "lag-metrics-demo")
            run(spark, s2.url, "lag-metrics-demo", listener, metrics, args.serve_seconds)
    finally:
        server.shutdown()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
