"""The suite's Spark Python processes import pyspark compiled (`_spark_site`): the zips
Spark puts first leave the path where the pip-installed pyspark has the same files, other
sitecustomize modules still run, and the session's workers really do (a Spark that lays
out its path otherwise would leave the suite slower, silently, but for this)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyspark
import pytest
from _spark_site import ON, SPARK_SITE

LIB = Path(pyspark.__file__).parent / "python" / "lib"
ZIPS = [str(LIB / "pyspark.zip"), *map(str, sorted(LIB.glob("py4j-*.zip")))]
JAR = [str(p) for p in (LIB.parent.parent / "jars").glob("spark-core_*.jar")]


def started_with(python_path: list[str]) -> dict[str, Any]:
    """sys.path and where pyspark and py4j came from, in a Python started as Spark starts
    its own (the zips first on PYTHONPATH)."""
    code = ("import json, sys, pyspark, py4j\n"
            "print(json.dumps({'path': sys.path, 'pyspark': pyspark.__file__,"
            " 'py4j': py4j.__file__, 'marker': sys.modules.get('marked') is not None,"
            " 'zip_importers': [p for p in sys.path_importer_cache"
            "                   if p.endswith(('.zip', '.jar'))]}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(run.stdout)


def test_the_zips_leave_the_path_and_the_importer_cache() -> None:
    """The jar too, and their importers: PySpark's `importlib.invalidate_caches()` would
    have each read its archive's index again."""
    assert len(ZIPS) == 2 and len(JAR) == 1 and all(map(os.path.exists, ZIPS)), ZIPS
    without = started_with([*ZIPS, *JAR])
    assert ".zip" in without["pyspark"] and ".zip" in without["py4j"]
    assert set(ZIPS + JAR) <= set(without["zip_importers"])
    got = started_with([*ZIPS, *JAR, SPARK_SITE])
    assert got["pyspark"] == pyspark.__file__ and ".zip" not in got["py4j"]
    assert not set(ZIPS + JAR) & set(got["path"] + got["zip_importers"])


def test_httpx_comes_without_its_command_line_client() -> None:
    code = "import sys, httpx; print(sorted({'rich', 'click'} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": SPARK_SITE}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_another_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['marked'] = sys\n")
    assert started_with([SPARK_SITE, str(tmp_path)])["marker"]


@pytest.mark.spark
def test_the_session_workers_import_pyspark_compiled(spark: Any) -> None:
    if not ON:
        pytest.skip("S2_SPARK_PYSPARK_ZIP=1: Spark's own order")
    files = spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("pyspark").__file__).collect()
    assert files == [pyspark.__file__]


def test_our_modules_are_imported_compiled() -> None:
    """A Python the suite starts (a Spark worker, the local server, a child script) reads
    our modules' bytecode, which the session wrote where Python writes none
    (`compile_tree`), rather than compiling them again."""
    run = subprocess.run([sys.executable, "-v", "-c", "import s2_spark.spark.s2.source"],
                         capture_output=True, text=True, check=True)
    ours = [line for line in run.stderr.splitlines() if line.startswith("# code object from")
            and f"{os.sep}s2_spark{os.sep}" in line]
    assert len(ours) > 20, run.stderr[-2000:]
    compiled = [line for line in ours if not line.endswith(".pyc'")]
    assert compiled == [], compiled
