"""The folder whose sitecustomize makes the suite's Spark Python processes import pyspark
compiled rather than from Spark's zip (`spark_site/sitecustomize.py` says why and what
it measured), and the PYTHONPATH that hands it to them. `S2_SPARK_PYSPARK_ZIP=1` leaves
Spark's order alone, as a user's Spark has it."""

from __future__ import annotations

import os

SPARK_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_site")
ON = os.environ.get("S2_SPARK_PYSPARK_ZIP") != "1"


def with_spark_site(python_path: str | None) -> str | None:
    """`python_path` with the folder first (unless switched off)."""
    if not ON:
        return python_path
    return os.pathsep.join(filter(None, [SPARK_SITE, python_path]))
