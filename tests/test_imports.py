"""No two modules of s2_spark import each other, directly or around a circle, counting
every import statement: at the top, under TYPE_CHECKING and inside functions alike.

And what Spark's Python interpreters import for our objects: each micro-batch, planner
interpreters unpickle the data source, build a stream writer and commit the tasks' commit
messages, tasks unpickle the writer or the reader; a new interpreter pays for every
module that imports. So an S2 query imports no Durable Streams module (and the reverse),
and nothing there imports the HTTP stack or pyarrow unless the call talks to a server or
handles Arrow data. Checked in fresh interpreters, on `sys.modules` (no timings).
"""

from __future__ import annotations

import ast
import graphlib
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "s2_spark"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that `name` imports (a `from` import of a submodule
    counts as that submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return (found & modules.keys()) - {name}


def test_no_import_circles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["s2_spark.s2._client"] >= {"s2_spark.s2._many"}  # the parser sees imports
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the circle


#: What no step below may import, whichever the format.
_HEAVY = ("s2_spark._http", "httpx", "httpcore", "pyarrow", "numpy")
#: Each format's own side: the other format's query never imports it.
_SIDES = {
    "s2": ("s2_spark.s2", "s2_spark.spark.s2", "s2_spark.backends.s2"),
    "durable-streams": ("s2_spark.durable", "s2_spark.spark.durable",
                        "s2_spark.backends.durable"),
}

_CHILD = """
import pickle, sys
import pyspark.sql.datasource  # what Spark's Python worker has imported already

before = set(sys.modules)
blobs = {name: open(path, "rb").read() for name, path in %r.items()}
%s
print(repr(sorted(set(sys.modules) - before)))
"""

#: What Spark's interpreters do with our objects (`pyspark.sql.worker.*`).
_STEPS = {
    # write_into_data_source: the data source, then its stream writer (pickled for tasks)
    "planner": "pickle.dumps(pickle.loads(blobs['source']).streamWriter("
               "pickle.loads(blobs['input']), False))",
    # python_streaming_sink_runner: a new writer commits the tasks' messages
    "commit": "pickle.loads(blobs['source']).streamWriter(pickle.loads(blobs['input']), "
              "False).commit(pickle.loads(blobs['messages']), 0)",
    "task": "pickle.loads(blobs['writer'])",
    "schema": "pickle.loads(blobs['reading']).schema()",
    "reader": "pickle.loads(blobs['reader'])",
}


def _objects(fmt: str) -> dict[str, Any]:
    """As Spark pickles them: a data source whose writer routes rows by their `stream`
    column (so building it checks no target on a server), its stream writer, the tasks'
    commit messages, and a stream reader."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from s2_spark.spark.writer import WriteCommitMessage

    if fmt == "s2":
        from s2_spark.backends.s2.results import StreamWriteResult as S2Result
        from s2_spark.spark import S2DataSource

        options = {"endpoint": "http://127.0.0.1:1", "basin": "b", "checkpointLocation": "/c"}
        source: Any = S2DataSource(options)
        reading: Any = S2DataSource({**options, "stream": "events"})
        results: list[Any] = [S2Result("events", 10, 0, 0, 10, 1)]
        payload = "body"
    else:
        from s2_spark.backends.durable.stream_sink import StreamWriteResult as DsResult
        from s2_spark.spark import DurableStreamsDataSource

        options = {"baseUrl": "http://127.0.0.1:1/streams", "checkpointLocation": "/c"}
        source = DurableStreamsDataSource(options)
        reading = DurableStreamsDataSource({**options, "stream": "events",
                                            "valueType": "binary"})
        results = [DsResult("events", "http://127.0.0.1:1/streams/events", 10, 1, 0)]
        payload = "value"
    schema = StructType([StructField(payload, BinaryType()), StructField("stream", StringType())])
    return {"source": source, "input": schema, "writer": source.streamWriter(schema, False),
            "messages": [WriteCommitMessage(0, 0, results)], "reading": reading,
            "reader": reading.streamReader(reading.schema())}


def _imported(step: str, paths: dict[str, str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", _CHILD % (paths, _STEPS[step])], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules: list[str] = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    return modules


@pytest.mark.parametrize("fmt", ["s2", "durable-streams"])
def test_spark_interpreters_import_only_the_formats_own_side(fmt: str, tmp_path: Path) -> None:
    paths = {}
    for name, obj in _objects(fmt).items():
        paths[name] = str(tmp_path / f"{name}.pickle")
        Path(paths[name]).write_bytes(pickle.dumps(obj))
    other = next(side for f, side in _SIDES.items() if f != fmt)
    for step in _STEPS:
        modules = _imported(step, paths)
        assert any(m.startswith(_SIDES[fmt]) for m in modules), (step, modules)
        wrong = [m for m in modules if m.startswith(other)]
        assert not wrong, f"{fmt} {step} imported the other format's {wrong}"
        # A task's reader reads Arrow batches; every other step handles no rows.
        heavy = _HEAVY[:3] if step == "reader" else _HEAVY
        wrong = [m for m in modules if m.split(".")[0] in heavy or m.startswith(heavy)]
        assert not wrong, f"{fmt} {step} imported {sorted({m.split('.')[0] for m in wrong})}"


@pytest.mark.parametrize("fmt", ["s2", "durable-streams"])
def test_a_pickled_stream_writer_names_its_format(fmt: str) -> None:
    """A writer pickles a reference to its format, not the format's option declarations
    (8.5 KB of a writer's pickle before)."""
    writer = _objects(fmt)["writer"]
    pickled = pickle.dumps(writer)
    assert len(pickled) < 2048, len(pickled)
    assert pickle.loads(pickled).fmt is writer.fmt


#: What an interpreter that only reads never imports: the write path (writers, sinks, their
#: plans), the append session and the append encoders (numpy, `pyarrow.compute`).
_WRITE_PATH = ("s2_spark.spark.writer", "s2_spark.spark.s2._writer", "s2_spark.backends.sink",
               "s2_spark.backends.s2.plan", "s2_spark.backends.s2.sink",
               "s2_spark.backends.s2.stream_sink", "s2_spark.s2._append_session",
               "s2_spark.s2._append_progress", "s2_spark.wire.appends", "pyarrow.compute")

_READING = """
import pickle, sys
import {floor}  # what Spark's interpreter has imported already (pyarrow among it)
from pyspark.sql.datasource_internal import _streamReader

before = set(sys.modules)
ds = pickle.loads(open({path!r}, "rb").read())
{code}
print(repr(sorted(set(sys.modules) - before)))
"""

#: What Spark's reading interpreters do with a reading data source, and their floors.
_READ_STEPS = {
    # python_streaming_source_runner: a new interpreter for each query
    "runner": ("pyspark.sql.streaming.python_streaming_source_runner",
               "r = _streamReader(ds, ds.schema())\n"
               "first = r.initialOffset()\n"
               "if hasattr(r, 'getDefaultReadLimit'):\n"
               "    last = r.latestOffset(first, r.getDefaultReadLimit())\n"
               "else:\n"
               "    last = r.latestOffset()\n"
               "assert r.partitions(first, last)\n"
               "r.commit(last)\n"
               "r.stop()"),
    # plan_data_source_read: a stream's reader (pickled for the tasks), a batch's partitions
    "plan": ("pyspark.sql.worker.plan_data_source_read",
             "pickle.dumps(_streamReader(ds, ds.schema()))"),
    "batch": ("pyspark.sql.worker.plan_data_source_read",
              "assert ds.reader(ds.schema()).partitions()"),
}


def test_reading_interpreters_import_no_write_path(s2_server: Any, basin: Any,
                                                    tmp_path: Path) -> None:
    """A source runner (and a read planner) that unpickles format s2's data source and
    looks up offsets and partitions against a server imports none of `_WRITE_PATH`."""
    from _s2_target import token

    from s2_spark.s2 import AppendRecord
    from s2_spark.spark import S2DataSource

    basin.create_stream("events")
    basin.stream("events").append_many([AppendRecord(b"x")] * 3)
    options = {"endpoint": s2_server.url, "basin": basin.name, "stream": "events"}
    secret = token()
    if secret is not None:
        options["accessToken"] = secret
    path = tmp_path / "source.pickle"
    path.write_bytes(pickle.dumps(S2DataSource(options)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for step, (floor, code) in _READ_STEPS.items():
        child = _READING.format(floor=floor, path=str(path), code=code)
        done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        modules: list[str] = ast.literal_eval(done.stdout.strip().splitlines()[-1])
        assert "s2_spark.spark.s2.source" in modules, (step, modules)
        if step != "plan":  # these talked to the server
            assert "s2_spark.s2._many" in modules, (step, modules)
        wrong = [m for m in modules if m in _WRITE_PATH]
        assert not wrong, f"{step} imported the write path: {wrong}"


def test_a_data_source_made_for_reading_imports_no_writer() -> None:
    """Unpickling format s2's data source and `schema()` import no writer; the write
    format is still there on first use (`S2_WRITE_FORMAT`, `write_format`)."""
    source = ("S2DataSource({'endpoint': 'http://127.0.0.1:1', 'basin': 'basin-a', "
              "'stream': 'events'})")
    code = ("import sys, pyspark.sql.datasource\n"
            "from s2_spark.spark import S2DataSource\n"
            f"{source}.schema()\n"
            f"print(sorted(m for m in sys.modules if m in {_WRITE_PATH!r}))\n"
            "from s2_spark.spark.s2 import source\n"
            "assert S2DataSource.write_format is source.S2_WRITE_FORMAT\n"
            "assert source.S2_WRITE_FORMAT.home == (source.__name__, 'S2_WRITE_FORMAT')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_reading_a_durable_stream_imports_no_pandas() -> None:
    """A Durable Streams read task turns JSON and byte answers into rows without pandas:
    `pa.array` of a list or an ndarray would import it (0.4-0.6 s of CPU in each Spark
    Python process that reads), so those arrays are made from buffers."""
    pytest.importorskip("pandas")  # else nothing could import it
    code = """
import sys
from s2_spark.backends.durable.backend import _Rows
from s2_spark.durable import ReadPiece
from s2_spark.wire.durable import JsonArrayPieces, bytes_batch

pieces = JsonArrayPieces()
json_piece = ReadPiece(pieces.feed(b'[1, "two"]'), b"", "0", "1", True, True, False,
                       "application/json")
assert pieces.finish().to_pylist() == []
json_rows = list(_Rows("json", "s", "0", 0).batches(iter([json_piece])))
bytes_piece = ReadPiece(None, b"abc", "0", "3", True, True, False,
                        "application/octet-stream")
byte_rows = list(_Rows("bytes", "s", "0", 0).batches(iter([bytes_piece])))
assert bytes_batch([b"x", b"yz"]).column(0).to_pylist() == [b"x", b"yz"]
print([r for b in json_rows + byte_rows for r in b.to_pylist()])
print("pandas" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows, pandas = done.stdout.strip().splitlines()
    assert ast.literal_eval(rows) == [
        {"stream": "s", "offset": "0", "index": 0, "value": "1"},
        {"stream": "s", "offset": "0", "index": 1, "value": '"two"'},
        {"stream": "s", "offset": "0", "index": 0, "value": b"abc"},
    ]
    assert pandas == "False"
