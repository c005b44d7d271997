"""The Spark session the Spark benchmarks run in, made one way for all of them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

#: Every benchmark's settings: no UI or progress bars (their threads cost CPU on the
#: driver), Python workers reused across tasks (Spark's default, said here).
SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
}


def local_session(app: str, conf: Mapping[str, str] | None = None,
                  sources: Iterable[type] = ()) -> Any:
    """A `local[2]` session named `app`, with `SETTINGS`, then `conf`, Spark's log at
    ERROR, and the Python data sources `sources` registered. This interpreter runs the
    Python workers unless `PYSPARK_PYTHON` says otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app)
    for key, value in {**SETTINGS, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for source in sources:
        spark.dataSource.register(source)
    return spark
