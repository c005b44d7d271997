"""The suite's Spark Python processes import pyspark as bytecode, not from pyspark.zip.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip`, py4j's zip and the spark-core jar at the
head of the path of every Python process it starts: its daemons, the workers they fork,
streaming source runners. The zips hold sources only, so each such process compiles every
pyspark module it imports: a streaming source runner spent 2.4-2.5 s of CPU starting,
1.0-1.2 s without, and Spark's Python processes are most of the suite's CPU. And each time
PySpark calls `importlib.invalidate_caches()` (as it sets up a task's files) every archive
on the path has its index read again (the jar's 6,000 entries, no Python module in them;
the zip's 1,500): 14-16% of a source runner's or a worker's CPU. Where a zip or the jar is
the pip-installed pyspark's own (`<site>/pyspark/python/lib/`, `<site>/pyspark/jars/`) and
`<site>`, which holds the same modules compiled, is on the path too, it leaves the path,
and its importer the importer cache. The tests put this folder on PYTHONPATH (conftest;
`S2_SPARK_PYSPARK_ZIP=1` leaves Spark's path alone, as a user's Spark has it). A
sitecustomize further on the path runs after this one. Every process the suite starts has
this folder on its path, so it also keeps httpx's command-line client unimported.
"""

import os
import sys


def _real(path: str) -> str:
    return os.path.normcase(os.path.realpath(path or "."))


def _drop_zips() -> None:
    """Take the pip-installed pyspark's zips and jar off the path (and their cached
    importers), where the folder they came with is on it."""
    folders = {_real(p) for p in sys.path if not p.endswith((".zip", ".jar"))}
    for entry in list(sys.path):
        if _spark_archive(os.path.normpath(entry), folders):
            sys.path.remove(entry)
            sys.path_importer_cache.pop(entry, None)


def _spark_archive(entry: str, folders: set[str]) -> bool:
    """pyspark.zip or py4j's zip in `<site>/pyspark/python/lib/`, or the spark-core jar in
    `<site>/pyspark/jars/` (no Python in it), with `<site>` on the path."""
    lib, name = os.path.split(entry)
    if lib.endswith(os.path.join("pyspark", "python", "lib")):
        site = os.path.dirname(os.path.dirname(os.path.dirname(lib)))
        package = ("pyspark" if name == "pyspark.zip"
                   else "py4j" if name.startswith("py4j-") and name.endswith(".zip") else None)
    elif lib.endswith(os.path.join("pyspark", "jars")) and name.startswith("spark-core_"):
        site, package = os.path.dirname(os.path.dirname(lib)), "pyspark"
    else:
        return False
    return (package is not None and _real(site) in folders
            and os.path.isdir(os.path.join(site, package)))


def _next_sitecustomize() -> None:
    """Run the sitecustomize this one hides (a distribution's), if there is one."""
    import importlib.machinery
    import importlib.util

    here = _real(os.path.dirname(os.path.abspath(__file__)))
    rest = [p for p in sys.path if _real(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _no_httpx_cli() -> None:
    """`import httpx` imports its command-line client, and with it rich, click and
    pygments, wherever those are installed (the dev extras install them): about 55 ms of
    CPU in each process that imports httpx, for a client no process of the suite runs."""
    sys.modules.setdefault("httpx._main", None)  # httpx's own fallback: no CLI


_drop_zips()
_no_httpx_cli()
_next_sitecustomize()
