"""The Spark session the Spark benchmarks run in, made one way for all of them.

A benchmark run from the command line starts its session here and stops it with
`stop_session`. A benchmark whose `main` is called in a process that has a session
already (the smoke run, tests/test_benchmarks_smoke.py: every Spark benchmark in one
session) is lent that session: its runtime settings are applied for the run and put back
by `stop_session`, which leaves the session running; settings fixed at the session's
start (`spark.jars`, `spark.ui.enabled`, ...) stay the lender's.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Every benchmark's settings: no UI or progress bars (their threads cost CPU on the
#: driver), Python workers reused across tasks (Spark's default, said here).
SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
}

#: Sessions lent to a benchmark (by id): the runtime settings to put back when it is done.
_LENT: dict[int, dict[str, str | None]] = {}


def local_session(app: str, conf: Mapping[str, str] | None = None,
                  sources: Iterable[type] = ()) -> Any:
    """A `local[2]` session named `app`, with `SETTINGS`, then `conf`, Spark's log at
    ERROR, and the Python data sources `sources` registered. This interpreter runs the
    Python workers unless `PYSPARK_PYTHON` says otherwise. Where this process has a
    session already, that one (lent: see the module's docstring)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    settings = {**SETTINGS, **(conf or {})}
    existing = SparkSession.getActiveSession()
    if existing is not None:
        before = {k: existing.conf.get(k, None) for k in settings
                  if existing.conf.isModifiable(k)}
        _LENT.setdefault(id(existing), before)
    builder = SparkSession.builder.master("local[2]").appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    for source in sources:
        spark.dataSource.register(source)
    return spark


def stop_session(spark: Any) -> None:
    """Stop a session `local_session` started; a lent one gets its runtime settings back
    and goes on running."""
    before = _LENT.pop(id(spark), None)
    if before is None:
        spark.stop()
        return
    for key, value in before.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


#: The phases of a micro-batch's `durationMs`, in the order Spark runs them.
PHASES = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets",
          "triggerExecution")


def phase_medians(progress: Sequence[Mapping[str, Any]]) -> str:
    """Each phase's median ms over the progress entries, as "latestOffset 3, ..." ("-":
    no entries)."""
    if not progress:
        return "-"
    return ", ".join(f"{k} {statistics.median(p['durationMs'].get(k, 0) for p in progress):.0f}"
                     for k in PHASES)
