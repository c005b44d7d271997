"""The C decoders of `s2_spark.wire`; everything else is declared in pyproject.toml.

`_fastwire` (S2 ReadBatch decoding, AppendInput encoding) and `_fastjson` (Durable Streams
JSON-mode bodies) are optional in an install from source: where they do not compile (no
compiler), the package installs with its pure-Python paths, which give the same results
more slowly (`s2_spark.wire.ACCELERATED` says which runs). A wheel build sets
`S2_SPARK_REQUIRE_C=1` (cibuildwheel does, see `[tool.cibuildwheel]`), and then a decoder
that fails to compile fails the build.

On CPython with the GIL they are built against the limited C API of 3.11 (abi3): one
wheel per platform serves every CPython from 3.11 on. `benchmarks/wire_builds.py`
measures that build against the full API in one run; it cost nothing measurable
(docs/getting-started.md). A free-threaded CPython has no limited API: there they are
built against the full one.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REQUIRED = os.environ.get("S2_SPARK_REQUIRE_C", "") == "1"
LIMITED_API = (sys.implementation.name == "cpython"
               and not sysconfig.get_config_var("Py_GIL_DISABLED"))
OLDEST = (3, 11)  # the oldest CPython the package supports (requires-python)
LIMITED_VERSION = f"0x{OLDEST[0]:02X}{OLDEST[1]:02X}0000"  # Py_LIMITED_API's hex form


def decoder(name: str) -> Extension:
    return Extension(
        f"s2_spark.wire.{name}",
        sources=[f"s2_spark/wire/{name}.c"],
        optional=not REQUIRED,
        py_limited_api=LIMITED_API,
        define_macros=[("Py_LIMITED_API", LIMITED_VERSION)] if LIMITED_API else [],
        # MSVC optimises with its own default flags (/Ox) and knows no -O3.
        extra_compile_args=[] if sys.platform == "win32" else ["-O3"],
    )


# A build for one CPython version (and GIL), as installs before 0.2.0 left in the source
# tree: `_fastwire.cpython-311-x86_64-linux-gnu.so`, `_fastwire.cp311-win_amd64.pyd`.
PER_VERSION = re.compile(r"\.(cpython-3\d+|cp3\d+)-[^.]*\.(so|pyd)$")


class BuildDecoders(build_ext):
    """build_ext that, building abi3 extensions in place (an editable install), removes
    the per-version builds beside them: Python loads `_fastwire.cpython-311-*.so` before
    `_fastwire.abi3.so`, so an old one would shadow the new build."""

    def run(self) -> None:
        super().run()
        if not (self.inplace and LIMITED_API):
            return
        for ext in self.extensions:
            built = Path(self.get_ext_fullpath(ext.name))
            if built.exists():
                for stale in built.parent.glob(f"{ext.name.rsplit('.', 1)[1]}.*"):
                    if PER_VERSION.search(stale.name):
                        stale.unlink()


setup(
    ext_modules=[decoder("_fastwire"), decoder("_fastjson")],
    cmdclass={"build_ext": BuildDecoders},
    # Their sources go in the sdist (as the extensions' sources), not in wheels.
    exclude_package_data={"s2_spark.wire": ["*.c"]},
    options={"bdist_wheel": {"py_limited_api": f"cp{OLDEST[0]}{OLDEST[1]}"}} if LIMITED_API else {},
)
