"""The folder whose sitecustomize makes the suite's Spark Python processes import pyspark
compiled rather than from Spark's zip (`spark_site/sitecustomize.py` says why and what
it measured), and the PYTHONPATH that hands it to them. `S2_SPARK_PYSPARK_ZIP=1` leaves
Spark's order alone, as a user's Spark has it. And our own modules' bytecode, written
once (`compile_tree`) where Python is told not to write it."""

from __future__ import annotations

import compileall
import os
import re
import sys

SPARK_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_site")
ON = os.environ.get("S2_SPARK_PYSPARK_ZIP") != "1"


def with_spark_site(python_path: str | None) -> str | None:
    """`python_path` with the folder first (unless switched off)."""
    if not ON:
        return python_path
    return os.pathsep.join(filter(None, [SPARK_SITE, python_path]))


#: What `compile_tree` leaves alone: npm's packages (some hold Python of their own).
_NOT_OURS = re.compile(r"node_modules")

#: The folders whose modules the suite's processes import from the checkout.
TREE = [os.path.join(os.path.dirname(SPARK_SITE), "..", name)
        for name in ("s2_spark", "tests", "benchmarks")]


def compile_tree() -> None:
    """Write the bytecode of `TREE` once where this interpreter writes none
    (PYTHONDONTWRITEBYTECODE, as on this project's CI machines): else every process that
    imports s2_spark from the checkout (a streaming query's source runner, Spark's planner
    and task workers, the local server, child scripts) compiles its ~90 modules again,
    0.15 s of CPU each time. Python reads bytecode it finds whatever the setting."""
    if sys.dont_write_bytecode:
        for folder in TREE:
            compileall.compile_dir(os.path.normpath(folder), quiet=1, rx=_NOT_OURS)
