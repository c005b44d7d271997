"""The suite's Spark Python processes import pyspark as bytecode, not from pyspark.zip.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` and py4j's zip at the head of the path of
every Python process it starts: its daemons, the workers they fork, streaming source
runners. The zips hold sources only, so each such process compiles every pyspark module
it imports (and re-reads the zip's index when Spark invalidates the import caches): a
streaming source runner spent 2.4-2.5 s of CPU starting, 1.0-1.2 s without, and Spark's
Python processes are most of the suite's CPU. Where a zip is the pip-installed pyspark's
own (`<site>/pyspark/python/lib/`) and `<site>`, which holds the same modules compiled, is
on the path too, the zip moves to the end of it: same files, bytecode. The tests put this
folder on PYTHONPATH (conftest; `S2_SPARK_PYSPARK_ZIP=1` leaves Spark's order alone, as a
user's Spark has it). A sitecustomize further on the path runs after this one.
"""

import os
import sys


def _real(path: str) -> str:
    return os.path.normcase(os.path.realpath(path or "."))


def _zips_last() -> None:
    """Move the pip-installed pyspark's zips after the folder they came with."""
    folders = {_real(p) for p in sys.path if not p.endswith(".zip")}
    moved = []
    for entry in sys.path:
        lib = os.path.dirname(entry)
        site = os.path.dirname(os.path.dirname(os.path.dirname(lib)))
        name = os.path.basename(entry)
        package = ("pyspark" if name == "pyspark.zip"
                   else "py4j" if name.startswith("py4j-") and name.endswith(".zip") else None)
        if (package is not None and lib.endswith(os.path.join("pyspark", "python", "lib"))
                and _real(site) in folders and os.path.isdir(os.path.join(site, package))):
            moved.append(entry)
    for entry in moved:
        sys.path.remove(entry)
    sys.path.extend(moved)


def _next_sitecustomize() -> None:
    """Run the sitecustomize this one hides (a distribution's), if there is one."""
    import importlib.machinery
    import importlib.util

    here = _real(os.path.dirname(os.path.abspath(__file__)))
    rest = [p for p in sys.path if _real(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_zips_last()
_next_sitecustomize()
