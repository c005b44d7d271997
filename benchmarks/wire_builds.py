"""The wire codecs' three builds in one run: the C decoders built against the full C API
(as per-version wheels ship them), built against the limited API (`Py_LIMITED_API`, as an
abi3 wheel would), and the pure-Python path a machine without a compiler falls back to.

Each build of `_fastwire` and `_fastjson` is compiled here from `s2_spark/wire/*.c` into a
temporary directory (`-O3`, as the package builds them) and loaded under its real name;
the workloads run with each in turn, round after round (so a load that comes and goes
hits all three alike; each round starts with another, and each measurement follows an
untimed call), and each measurement is the CPU time of this thread (`time.thread_time`),
not wall time. Figures are the median over rounds, as ratios
against the full-API build.

Workloads: `decode` is `benchmarks/decode.py`'s path (S2S frames of ReadBatch messages to
Arrow through FrameDecoder and decode_read_batch, 100 B and 16 KiB bodies, uncompressed);
`encode` is the Spark writer's Arrow path (`encode_entries`, 100 B bodies with one header);
`json` is a Durable Streams JSON-mode body (1,000 messages of ~100 B) split by
`split_json_array`.

Run: python benchmarks/wire_builds.py [--rounds N] [--records N --big-records N --messages N]
(last line: `wire builds: limited API Nx the full API (decode), pure Python Mx`)
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
from decode import make_frames  # benchmarks/ is on sys.path

from s2_spark.errors import FrameError
from s2_spark.wire import appends, durable, records
from s2_spark.wire.frames import Compression, FrameDecoder, Message

ROOT = Path(__file__).resolve().parent.parent
WIRE = ROOT / "s2_spark" / "wire"
LIMITED = 0x030B0000  # the oldest CPython the package supports, 3.11
CHUNK = 64 * 1024


def build(out: Path, limited: bool) -> dict[str, ModuleType]:
    """Compile both extensions (full or limited API) into `out` and load them."""
    from setuptools import Distribution, Extension

    macros = [("Py_LIMITED_API", hex(LIMITED))] if limited else []
    exts = [
        Extension(f"s2_spark.wire.{name}", [str(WIRE / f"{name}.c")], define_macros=macros,
                  py_limited_api=limited, extra_compile_args=["-O3"])
        for name in ("_fastwire", "_fastjson")
    ]
    dist = Distribution({"name": "wire-builds", "ext_modules": exts})
    cmd: Any = dist.get_command_obj("build_ext")
    cmd.build_lib, cmd.build_temp, cmd.inplace = str(out / "lib"), str(out / "tmp"), False
    cmd.ensure_finalized()
    cmd.run()
    loaded = {}
    for ext in exts:
        path = str(out / "lib" / cmd.get_ext_filename(ext.name))
        loader = importlib.machinery.ExtensionFileLoader(ext.name, path)
        spec = importlib.util.spec_from_file_location(ext.name, path, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        loaded[ext.name.rsplit(".", 1)[1]] = module
    loaded["_fastwire"]._set_error_type(FrameError)
    return loaded


def use(build: dict[str, ModuleType] | None) -> None:
    """Point the codecs at one build (None: the pure-Python paths)."""
    fastwire = build["_fastwire"] if build else None
    records._fastwire = appends._fastwire = fastwire  # type: ignore[attr-defined]
    durable._fastjson = build["_fastjson"] if build else None  # type: ignore[attr-defined]


def decode_workload(body_size: int, n: int) -> Callable[[], int]:
    frames, _ = make_frames(body_size, n, Compression.NONE)
    parts = [frames[i : i + CHUNK] for i in range(0, len(frames), CHUNK)]

    def run() -> int:
        decoder = FrameDecoder()
        got = 0
        for part in parts:
            for frame in decoder.feed(part):
                assert isinstance(frame, Message)
                got += records.decode_read_batch(frame.body, "bench").batch.num_rows
        assert got == n
        return got

    return run


def encode_workload(n: int) -> Callable[[], int]:
    bodies = pa.array([b"x" * 90 + b"%010d" % i for i in range(n)], pa.binary())
    header = pa.array([[(b"k", b"v")]] * n, records.HEADER_TYPE)

    def run() -> int:
        encoded = appends.encode_entries(bodies, header)
        assert len(encoded) == n
        return n

    return run


def json_workload(n: int) -> Callable[[], int]:
    body = b"[" + b",".join(b'{"id":%d,"kind":"event","payload":"%s"}' % (i, b"p" * 60)
                            for i in range(n)) + b"]"

    def run() -> int:
        offsets, _ = durable.split_json_array(body)
        assert len(offsets) == n + 1
        return n

    return run


def cpu_seconds(fn: Callable[[], int], reps: int) -> float:
    t0 = time.thread_time()
    for _ in range(reps):
        fn()
    return (time.thread_time() - t0) / reps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--records", type=int, default=100_000,
                    help="records of 100 B a call (decode, encode)")
    ap.add_argument("--big-records", type=int, default=2_000,
                    help="records of 16 KiB a call (decode)")
    ap.add_argument("--messages", type=int, default=1_000, help="JSON messages a call")
    args = ap.parse_args(argv)
    n, big, msgs = args.records, args.big_records, args.messages
    workloads: dict[str, tuple[Callable[[], int], int, int]] = {
        # name: (function, records per call, calls per measurement)
        "decode 100 B": (decode_workload(100, n), n, 3),
        "decode 16 KiB": (decode_workload(16 * 1024, big), big, 3),
        "encode 100 B": (encode_workload(n), n, 3),
        "json 100 B": (json_workload(msgs), msgs, 200),
    }
    with tempfile.TemporaryDirectory() as tmp:
        builds: dict[str, dict[str, ModuleType] | None] = {
            "full API": build(Path(tmp) / "full", limited=False),
            "limited API": build(Path(tmp) / "limited", limited=True),
            "pure Python": None,
        }
        print(f"python {sys.version.split()[0]}; CPU time of this thread, median of "
              f"{args.rounds} rounds, builds interleaved")
        times: dict[tuple[str, str], list[float]] = {}
        for name, (fn, _, reps) in workloads.items():
            for b in builds.values():  # warm-up, and a check that each build runs
                use(b)
                fn()
            labels = list(builds)
            for r in range(args.rounds):
                # Each round starts with another build, and each measurement follows an
                # untimed call of its own: none always runs after the pure-Python path's
                # allocations, or first.
                for label in labels[r % 3:] + labels[: r % 3]:
                    use(builds[label])
                    fn()
                    # The pure-Python paths are much slower: fewer calls per measurement.
                    times.setdefault((name, label), []).append(
                        cpu_seconds(fn, reps if builds[label] is not None else 1))
        use(builds["full API"])
    print("CPU time per record against the full-API build (2.00x: twice the CPU):")
    header = f"{'workload':<14} | {'full API':>16} | {'limited API':>12} | {'pure Python':>12}"
    print(header)
    print("-" * len(header))
    ratios: dict[tuple[str, str], float] = {}
    for name, (_, n, _) in workloads.items():
        full = statistics.median(times[(name, "full API")])
        cells = []
        for label in ("limited API", "pure Python"):
            ratios[(name, label)] = statistics.median(times[(name, label)]) / full
            cells.append(f"{ratios[(name, label)]:>11.2f}x")
        print(f"{name:<14} | {n / full / 1e6:>9.2f}M rec/s | {cells[0]} | {cells[1]}")
    print(f"wire builds: limited API {ratios[('decode 100 B', 'limited API')]:.2f}x the full "
          f"API (decode), pure Python {ratios[('decode 100 B', 'pure Python')]:.1f}x")


if __name__ == "__main__":
    main()
