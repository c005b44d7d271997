"""A Spark Connect client: read S2 streams and copy them into S2, through a remote Spark.

The client only needs `pyspark[connect]` (or `pyspark-client`); s2-spark must be installed
where the queries run, on the Connect server and its executors, which is where Spark looks
up `format("s2")`. No register() call is made (nor possible for a server-side package).

    python examples/connect_client.py --remote sc://HOST:15002 --endpoint http://s2-lite:8080 \\
        --basin my-basin --source events --target events-copy --checkpoint /ckpt/copy

It prints the source records (a batch read), copies every record available now into the
target stream with a checkpointed streaming query (run it again: only new records are
copied), and prints the target's records. The checkpoint path is on the server's side.
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import DataFrame, SparkSession


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", required=True, help="sc://host:port")
    parser.add_argument("--endpoint", help="s2-lite or local server URL; default: s2.dev")
    parser.add_argument("--basin", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    return parser.parse_args(argv)


def show(label: str, df: DataFrame) -> None:
    rows = df.orderBy("seq_num").collect()
    print(f"{label}: {[bytes(row.body).decode() for row in rows]}")


def main(argv: list[str]) -> int:
    args = parse(argv)
    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    connection = {"endpoint": args.endpoint} if args.endpoint else {}

    def batch(stream: str) -> DataFrame:
        return (spark.read.format("s2").options(**connection).option("basin", args.basin)
                .option("stream", stream).load())

    show("source", batch(args.source))
    query = (
        spark.readStream.format("s2").options(**connection)
        .option("basin", args.basin).option("stream", args.source).load()
        .writeStream.format("s2").options(**connection)
        .option("basin", args.basin).option("stream", args.target)
        .option("createStreams", "true")
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    show("target", batch(args.target))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
