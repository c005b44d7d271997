"""Our modules out of the way of the garbage collection Spark runs after every task.

A reused PySpark worker (the executors' `pyspark.worker`, and the driver's planner
interpreters: `write_into_data_source`, the sink's commit runner, the read planners)
is a child of `pyspark.daemon`, which runs `gc.collect()` after every call it serves
(`spark.python.worker.reuse`, on by default). A full collection walks every tracked
object in the heap, and modules are most of them: pyspark's own are about 33,000
objects, and the S2 client, pyarrow and the HTTP stack more than double that, which made
each collection 2-3 times dearer: about 30 ms of CPU a micro-batch on top of Spark's
floor in the two planner interpreters alone, and as much again in the tasks.

So once one of our entry points has imported modules in such a worker, `settle()`
collects once and freezes what is alive (`gc.freeze`): later collections skip it. A
module is never freed anyway; the one cost is that an object alive at that moment and
left in a reference cycle later is not reclaimed (plain objects still go by reference
counting), which is bounded by what one call holds, once per import. Outside a daemon's
reused worker (the user's driver, Spark Connect clients, `spark.python.use.daemon`
false, the streaming source runner, which collects nothing) it does nothing.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

__all__ = ["in_reused_worker", "settle", "settled", "settled_after"]

_P = ParamSpec("_P")
_T = TypeVar("_T")

_settled_modules = 0  # len(sys.modules) at the last freeze


def in_reused_worker() -> bool:
    """Whether this interpreter is a worker `pyspark.daemon` reuses (and collects after
    every call)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return (getattr(spec, "name", None) == "pyspark.daemon"
            and os.environ.get("SPARK_REUSE_WORKER") == "1")


def settle() -> None:
    """In a reused worker, freeze the heap once more modules were imported since the last
    time (a length check otherwise)."""
    global _settled_modules
    if len(sys.modules) == _settled_modules or not in_reused_worker():
        return
    gc.collect()
    gc.freeze()
    _settled_modules = len(sys.modules)


def settled(call: Callable[_P, _T]) -> Callable[_P, _T]:
    """`call`, then `settle()` (an entry point Spark calls in a reused worker)."""

    @functools.wraps(call)
    def settling(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return call(*args, **kwargs)
        finally:
            settle()

    return settling


def settled_after(items: Iterator[_T]) -> Iterator[_T]:
    """`items`, then `settle()` once they are all out (a read task's batches)."""
    try:
        yield from items
    finally:
        settle()
