"""A package's public names, imported from their modules on first use (PEP 562).

Spark's planner interpreters, source runner and tasks unpickle our data sources, writers,
readers and commit messages, and every interpreter that is new pays for each module that
imports. A package `__init__` that imported all its modules would make an S2 query import
the Durable Streams side, the HTTP stack and pyarrow just to name a class; instead it
lists where each name lives:

    __getattr__, __dir__ = lazy_exports(__name__, {"S2DataSource": "s2_spark.spark.s2.source"})

(with the same names imported under `TYPE_CHECKING` for type checkers).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, whose public names `names` maps to the
    modules defining them. A name is imported on first access, then kept in the package's
    namespace (so later lookups are plain attribute reads)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
