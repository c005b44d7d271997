"""What a new Python interpreter of Spark's pays for our objects: the imports (CPU,
modules) of unpickling the data source, stream writer, stream reader and commit messages,
and of the calls Spark makes on them, per format, against pyspark's own import.

Every micro-batch Spark's planner interpreters (daemon-forked workers running
`pyspark.sql.worker.write_into_data_source` and `python_streaming_sink_runner`), the
streaming source runner and each read and write task unpickle what we pickled; an
interpreter that is new pays for every module that needs. Each step below runs in a fresh
interpreter that first imports `pyspark.sql.datasource` (the floor, "peer": what pyspark's
own worker imports cost), then does the step: its CPU, the modules it added (and whether
it imported the other format, the HTTP stack or pyarrow) and `-X importtime`'s cumulative
microseconds of its imports. Medians of `--runs` runs, after one warm-up run per step
that writes the bytecode (.pyc) of every module imported into a cache of its own, as an
installed wheel has it (`--no-warmup`: no warm-up run; `--compile`: none, every run
compiles our modules from source, as where PYTHONDONTWRITEBYTECODE is set and the package
is a source checkout).

Steps (per format):
  source   unpickle the DataSource
  schema   unpickle a reading DataSource, `schema()`
  writer   unpickle the stream writer (a write task)
  planner  unpickle the DataSource, `streamWriter()`, pickle the writer
           (`write_into_data_source`)
  commit   unpickle the DataSource, `streamWriter()`, unpickle the commit messages,
           `commit(messages, 0)` (`python_streaming_sink_runner`)
  reader   unpickle the stream reader (a read task)
  plan     unpickle a reading DataSource, `streamReader(schema)`, pickle the reader
           (`plan_data_source_read` for a stream; format s2 only, as the two below)
  runner   unpickle a reading DataSource, `streamReader(schema)`, `initialOffset()`,
           `latestOffset()`, `partitions(initial, latest)`, `commit(latest)`, `stop()`
           (`python_streaming_source_runner`, a new interpreter per query), against a
           local S2 server (`ServerProcess`, started here) with one stream of a few records
  batch    unpickle a reading DataSource, `reader(schema)`, `partitions()`
           (`plan_data_source_read` for a batch read), against that server

The writers route rows by their `stream` column, so `streamWriter()` checks no target and
talks to no server (endpoint http://127.0.0.1:1); a fixed target stream is checked on the
driver at each `streamWriter()`, which opens a connection and imports the HTTP stack.
Ends with one line per format:
`planner_imports <format>: source +<ms> ms (<r>x peer), schema ..., reader ...[, plan ...,
runner ..., batch ...]`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: Watched for: a step imports them only if it needs them.
WATCHED = ("s2_spark.durable", "s2_spark.spark.durable", "s2_spark.s2", "s2_spark.spark.s2",
           "s2_spark._http", "httpx", "httpcore", "pyarrow", "pyarrow.compute",
           "s2_spark.spark.writer", "s2_spark.s2._append_session", "s2_spark.s2._watch")

_CHILD = r"""
import sys, time
t0 = time.process_time()
import {floor}
import pickle
t1 = time.process_time()
before = set(sys.modules)
print("-- step --", file=sys.stderr, flush=True)
blobs = {{k: open(v, "rb").read() for k, v in {paths!r}.items()}}
{code}
t2 = time.process_time()
added = sorted(set(sys.modules) - before)
print(repr((t1 - t0, t2 - t1, added)))
"""

_STEPS = {
    "source": "ds = pickle.loads(blobs['source'])",
    "schema": "ds = pickle.loads(blobs['read-source']); ds.schema()",
    "writer": "w = pickle.loads(blobs['writer'])",
    "planner": ("ds = pickle.loads(blobs['source'])\n"
                "pickle.dumps(ds.streamWriter(pickle.loads(blobs['input']), False))"),
    "commit": ("ds = pickle.loads(blobs['source'])\n"
               "w = ds.streamWriter(pickle.loads(blobs['input']), False)\n"
               "w.commit(pickle.loads(blobs['messages']), 0)"),
    "reader": "r = pickle.loads(blobs['reader'])",
    "plan": ("from pyspark.sql.datasource_internal import _streamReader\n"
             "ds = pickle.loads(blobs['server-source'])\n"
             "pickle.dumps(_streamReader(ds, pickle.loads(blobs['read-schema'])))"),
    "runner": ("from pyspark.sql.datasource_internal import _streamReader\n"
               "ds = pickle.loads(blobs['server-source'])\n"
               "r = _streamReader(ds, pickle.loads(blobs['read-schema']))\n"
               "first = r.initialOffset()\n"
               "if hasattr(r, 'getDefaultReadLimit'):  # admission control (4.2+)\n"
               "    last = r.latestOffset(first, r.getDefaultReadLimit())\n"
               "else:\n"
               "    last = r.latestOffset()\n"
               "assert r.partitions(first, last), (first, last)\n"
               "r.commit(last)\n"
               "r.stop()"),
    "batch": ("ds = pickle.loads(blobs['server-source'])\n"
              "assert ds.reader(pickle.loads(blobs['read-schema'])).partitions()"),
}

#: What each step's interpreter has imported before it starts: pyspark's own worker
#: module (the runner's and the read planner's import pyarrow), so a step's figures are
#: ours alone. The peer, every other step's floor: `pyspark.sql.datasource`.
_PEER = "pyspark.sql.datasource"
_FLOORS = {"plan": "pyspark.sql.worker.plan_data_source_read",
           "batch": "pyspark.sql.worker.plan_data_source_read",
           "runner": "pyspark.sql.streaming.python_streaming_source_runner"}

#: Steps that talk to a server: format s2 only (its local server starts in a moment).
_SERVER_STEPS = ("plan", "runner", "batch")


def _objects(fmt: str, server: str | None = None) -> dict[str, Any]:
    """What Spark pickles for `fmt`: the data source (writing options), the write input's
    schema, a stream writer, its tasks' commit messages, and a stream reader; with
    `server` (an S2 endpoint whose basin `my-basin` has stream `events`), a reading data
    source for it and its schema."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from s2_spark.spark.writer import WriteCommitMessage

    common = {"checkpointLocation": "/tmp/planner-imports-ckpt"}
    if fmt == "s2":
        try:
            from s2_spark.backends.s2.results import StreamWriteResult as S2Result
        except ImportError:  # a commit before the lazy imports, measured for comparison
            from s2_spark.backends.s2.stream_sink import (
                StreamWriteResult as S2Result,
            )
        from s2_spark.spark import S2DataSource

        options = {**common, "endpoint": "http://127.0.0.1:1", "basin": "my-basin"}
        source: Any = S2DataSource(options)
        reading: Any = S2DataSource({**options, "stream": "events"})
        results: list[Any] = [S2Result("events", 10, 0, 0, 10, 1)]
    else:
        from s2_spark.backends.durable.stream_sink import StreamWriteResult as DsResult
        from s2_spark.spark import DurableStreamsDataSource

        options = {**common, "baseUrl": "http://127.0.0.1:1/v1/stream"}
        source = DurableStreamsDataSource(options)
        reading = DurableStreamsDataSource({**options, "stream": "events",
                                            "valueType": "binary"})
        results = [DsResult("events", "http://127.0.0.1:1/v1/stream/events", 10, 1, 0)]
    body = "body" if fmt == "s2" else "value"
    schema = StructType([StructField(body, BinaryType()), StructField("stream", StringType())])
    served = {}
    if server is not None:
        served_source = S2DataSource({**options, "endpoint": server, "stream": "events"})
        served = {"server-source": served_source, "read-schema": served_source.schema()}
    return {
        **served,
        "source": source,
        "input": schema,
        "writer": source.streamWriter(schema, False),
        "messages": [WriteCommitMessage(0, 0, results), WriteCommitMessage(1, 0, [])],
        "read-source": reading,
        "reader": reading.streamReader(reading.schema()),
    }


def _run(step: str, paths: dict[str, str], pycache: str | None, *, importtime: bool = False
         ) -> tuple[float, float, list[str], int]:
    """One fresh interpreter: floor CPU s, step CPU s, modules the step added, and (with
    `importtime`, which slows the imports it times) the cumulative importtime (us) of the
    step's top-level imports. `pycache`: where bytecode is kept (None: none is)."""
    code = _CHILD.format(paths=paths, code=_STEPS[step], floor=_FLOORS.get(step, _PEER))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if pycache is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    flags = ["-X", "importtime"] if importtime else []
    out = subprocess.run([sys.executable, *flags, "-c", code], env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"step {step} failed:\n{out.stderr[-3000:]}")
    floor, cpu, added = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    _, _, after = out.stderr.partition("-- step --")
    micros = 0
    for line in after.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if not name.startswith("  ") and cumulative.strip().isdigit():
                micros += int(cumulative)
    return floor, cpu, added, micros


def _top(modules: list[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in modules})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per step (median)")
    parser.add_argument("--format", choices=("s2", "durable-streams"), action="append",
                        help="the formats to measure (default: both)")
    parser.add_argument("--modules", action="store_true",
                        help="list every module each step adds")
    parser.add_argument("--compile", action="store_true",
                        help="no bytecode cache: every run compiles the modules it imports")
    parser.add_argument("--no-warmup", action="store_true",
                        help="leave out each step's warm-up run (a smoke run's figures then "
                             "include writing the bytecode)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="planner-imports-") as tmp:
        pycache = None if args.compile else str(Path(tmp, "pycache"))
        print(f"bytecode: {'none, compiled every run' if pycache is None else 'cached'}")
        with contextlib.ExitStack() as stack:
            for fmt in args.format or ["s2", "durable-streams"]:
                _measure(fmt, args, tmp, pycache,
                         _served(stack) if fmt == "s2" else None)


def _served(stack: contextlib.ExitStack) -> str:
    """A local S2 server (a child process, so its CPU is not counted) whose basin
    `my-basin` has stream `events` with a few records."""
    from _streams import fill  # benchmarks/ is on sys.path

    from s2_spark.testing import ServerProcess

    server = stack.enter_context(ServerProcess())
    fill(server.url, "my-basin", "events", 5, 10)
    return server.url


def _measure(fmt: str, args: argparse.Namespace, tmp: str, pycache: str | None,
             server: str | None) -> None:
    """Every step of `fmt` (with `server`, the steps that talk to it too), printed."""
    paths = {}
    for key, obj in _objects(fmt, server).items():
        path = Path(tmp, f"{fmt}-{key}.pickle")
        path.write_bytes(pickle.dumps(obj))
        paths[key] = str(path)
    sizes = ", ".join(f"{k} {Path(p).stat().st_size} B" for k, p in paths.items()
                      if k in ("source", "writer", "messages", "reader"))
    print(f"{fmt}: pickled {sizes}")
    floors: list[float] = []
    summary = []
    for step in _STEPS:
        if step in _SERVER_STEPS and server is None:
            continue
        if pycache is not None and not args.no_warmup:
            _run(step, paths, pycache)  # warm-up: writes the bytecode
        runs = [_run(step, paths, pycache) for _ in range(args.runs)]
        timed = [_run(step, paths, pycache, importtime=True) for _ in range(args.runs)]
        if step not in _FLOORS:
            floors += [r[0] for r in runs]
        cpu = statistics.median(r[1] for r in runs) * 1000
        micros = statistics.median(r[3] for r in timed)
        added = runs[-1][2]
        watched = [w for w in WATCHED if w in added]
        floor = statistics.median(floors) * 1000
        print(f"  {step:8} +{cpu:6.1f} ms CPU ({cpu / floor:.2f}x peer), "
              f"{len(added):3} modules, importtime {micros / 1000:6.1f} ms; "
              f"watched: {', '.join(watched) or 'none'}")
        print(f"           top-level: {', '.join(_top(added)) or 'none'}")
        if args.modules:
            print(f"           {' '.join(added)}")
        summary.append(f"{step} +{cpu:.0f} ms ({cpu / floor:.2f}x peer)")
    floor = statistics.median(floors) * 1000
    print(f"  floor (import pyspark.sql.datasource): {floor:.1f} ms CPU")
    print(f"planner_imports {fmt}: " + ", ".join(summary))


if __name__ == "__main__":
    main()
