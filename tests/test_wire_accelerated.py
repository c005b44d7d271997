"""Which path the wire codecs take: `s2_spark.wire.ACCELERATED`, the debug line that says so
once, and the pure-Python paths an install without the C decoders falls back to.

Each wheel runs these too (pyproject.toml's `[tool.cibuildwheel]`), with
S2_SPARK_REQUIRE_C=1: there the C decoders must be in use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import s2_spark.wire
from s2_spark.wire import appends, durable, records

# Imports the codecs as a build without a C compiler has them: the two extension modules
# cannot be found.
_NO_DECODERS = """
import sys

class _NoDecoders:
    def find_spec(self, name, path=None, target=None):
        if name in ("s2_spark.wire._fastwire", "s2_spark.wire._fastjson"):
            raise ImportError(f"no module named {name!r}")
        return None

sys.meta_path.insert(0, _NoDecoders())
"""

_LOGGING = """
import logging
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s")
"""

# The same data through each codec, printed as JSON.
_CODECS = """
import json
import pyarrow as pa
import s2_spark.wire
from s2_spark._proto import s2_pb2
from s2_spark.wire import appends, durable, records

batch = s2_pb2.ReadBatch(records=[
    s2_pb2.SequencedRecord(seq_num=7 + i, timestamp=1_700_000_000_000 + i,
                           headers=[s2_pb2.Header(name=b"k", value=b"v%d" % i)],
                           body=b"body-%d" % i)
    for i in range(5)
])
decoded = records.decode_read_batch(batch.SerializeToString(), "orders").batch
encoded = appends.encode_entries(pa.array([b"a", b"", b"ccc"], pa.binary()))
offsets, values = durable.split_json_array(b'[{"a": [1, 2]}, "x", 3 ]')
print(json.dumps({
    "accelerated": s2_spark.wire.ACCELERATED,
    "implementations": [records.IMPLEMENTATION, appends.IMPLEMENTATION,
                        durable.IMPLEMENTATION],
    "decoded": [[str(v) for v in column.to_pylist()] for column in decoded.columns],
    "encoded": bytes(encoded.payload).hex(),
    "json": [list(map(int, offsets)), bytes(values).decode()],
}))
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "S2_SPARK_REQUIRE_C"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, check=True, env=env)


def _wire_log(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("s2_spark.wire ")]


def test_accelerated_says_whether_every_codec_uses_the_c_decoders() -> None:
    in_use = [records._fastwire is not None, appends._fastwire is not None,
              durable._fastjson is not None]
    assert s2_spark.wire.ACCELERATED is all(in_use)
    assert all(in_use) or not any(in_use)
    implementations = [records.IMPLEMENTATION, appends.IMPLEMENTATION, durable.IMPLEMENTATION]
    assert implementations == (["c", "c", "c"] if all(in_use) else ["python", "python", "numpy"])


@pytest.mark.skipif(os.environ.get("S2_SPARK_REQUIRE_C") != "1",
                    reason="the C decoders are required only where S2_SPARK_REQUIRE_C=1 (wheels)")
def test_a_wheel_uses_its_c_decoders() -> None:
    assert s2_spark.wire.ACCELERATED


@pytest.mark.skipif(not s2_spark.wire.ACCELERATED, reason="this install has no C decoders")
def test_the_c_decoders_in_use_are_logged_once_at_debug_level() -> None:
    done = _python(_LOGGING + _CODECS + "import s2_spark.durable, s2_spark.s2\n")
    assert _wire_log(done.stderr) == [
        "s2_spark.wire DEBUG wire codecs: the C decoders are in use (_fastwire, _fastjson)"
    ]


def test_without_the_c_decoders_the_pure_python_paths_give_the_same_results() -> None:
    done = _python(_NO_DECODERS + _LOGGING + _CODECS)
    fallback: dict[str, Any] = json.loads(done.stdout)
    assert fallback["accelerated"] is False
    assert fallback["implementations"] == ["python", "python", "numpy"]
    log = _wire_log(done.stderr)
    assert len(log) == 1
    assert log[0].startswith("s2_spark.wire DEBUG wire codecs: the C decoders are not in use "
                             "(_fastwire: no module named 's2_spark.wire._fastwire'; "
                             "_fastjson: no module named 's2_spark.wire._fastjson')")
    assert "pure-Python paths" in log[0]
    this_install: dict[str, Any] = json.loads(_python(_CODECS).stdout)
    assert this_install["accelerated"] is s2_spark.wire.ACCELERATED
    for key in ("decoded", "encoded", "json"):
        assert fallback[key] == this_install[key]
    assert fallback["json"] == [[0, 13, 16, 17], '{"a": [1, 2]}"x"3']
