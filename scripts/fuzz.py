"""Coverage-guided fuzzing of the wire decoders (atheris), optionally under ASan + UBSan.

    python scripts/fuzz.py --seconds 60                       # every target, 60 s each
    python scripts/fuzz.py --target read_batch --runs 1000000 --sanitize
    python scripts/fuzz.py --coverage                         # C line coverage of the corpus

The targets are in `tests/fuzz_targets.py`: each runs one input through the C accelerator
and the pure-Python path of one decoder, or through one of the HTTP readers and the
library it is checked against (h11, h2), and fails when they disagree. Each target runs in
its own process (libFuzzer exits when done): forked from one that has imported and
instrumented everything, or a new interpreter under the sanitizers. It is seeded from
`tests/data/fuzz/<target>/`; the inputs it finds go to `.fuzz/corpus/<target>/` (ignored
by git). An input that fails is copied into `tests/data/fuzz/<target>/`, where
`tests/test_fuzz.py` replays it on every test run from then on: commit it with the fix.

`--sanitize` builds both extensions with clang (`-fsanitize=address,undefined` and
libFuzzer's coverage counters, so the fuzzer sees C branches as well as Python ones) into
`.fuzz/build/`, never into the package, and runs with atheris' ASan runtime preloaded and
Python's allocator switched to malloc, so every Python object has ASan red zones around
it; then it replays the target's corpus with LeakSanitizer checking every input. It needs
clang (`apt-get install clang`); without `--sanitize` the package's own build is fuzzed.
`--coverage` builds the extensions with gcc's `--coverage` instead, replays the corpus
through them and prints gcov's line and branch figures.

Prints one Markdown row per target: inputs run, seconds, inputs/s, libFuzzer's coverage
(`cov`: edges in C and Python; `ft`: features), corpus size, and the result. Exits
non-zero if any target failed.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "tests" / "data" / "fuzz"
WORK = ROOT / ".fuzz"
SOURCES = {name: ROOT / "s2_spark" / "wire" / f"{name}.c" for name in ("_fastwire", "_fastjson")}
EXT_DIR_ENV = "S2_SPARK_FUZZ_EXT_DIR"  # where the child loads the extensions from
SANITIZE = ("-fsanitize=address,undefined,fuzzer-no-link", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer", "-g", "-O1")

sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", action="append", help="a target name (default: all)")
    parser.add_argument("--seconds", type=int, default=0, help="time per target")
    parser.add_argument("--runs", type=int, default=-1, help="inputs per target")
    parser.add_argument("--sanitize", action="store_true", help="C built with ASan + UBSan")
    parser.add_argument("--coverage", action="store_true", help="gcov of the corpus")
    parser.add_argument("--work", type=Path, default=ROOT / ".fuzz",
                        help="where the corpus found, logs and builds go (default .fuzz/)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--leaks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global WORK
    WORK = args.work.resolve()
    if args.child:
        return _child(args.child, args.seconds, args.runs, args.leaks)
    from fuzz_targets import TARGETS

    names = args.target or list(TARGETS)
    unknown = set(names) - set(TARGETS)
    if unknown:
        parser.error(f"unknown target(s) {sorted(unknown)}; known: {', '.join(TARGETS)}")
    if args.coverage:
        return _coverage(names)
    if args.seconds <= 0 and args.runs < 0:
        parser.error("give --seconds or --runs")
    env = dict(os.environ)
    if args.sanitize:
        env.update(_sanitizer_env(_build("asan", SANITIZE)))
    print("| target | inputs | seconds | inputs/s | cov | ft | corpus | result |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    failed = [name for name in names if not _run(name, args, env)]
    return 1 if failed else 0


def _run(name: str, args: argparse.Namespace, env: dict[str, str]) -> bool:
    """One target: fuzz it, then (sanitized) replay its corpus checking every input for
    leaks, each in a child process. Prints its row; a failing input is saved as a seed."""
    (WORK / "corpus" / name).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    code, text = _phase(name, env, args.seconds, args.runs)
    seconds = time.monotonic() - started  # start-up included
    units = re.search(r"stat::number_of_executed_units: (\d+)", text)
    stats = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)", text)
    runs = int(units[1]) if units else 0
    cov, ft, corp = stats[-1] if stats else ("?", "?", "?")
    result = "ok" if code == 0 and "Done" in text else f"FAILED (exit {code})"
    if result == "ok" and args.sanitize:
        code, text = _phase(name, env, 0, 0, leaks=True)
        checked = re.search(r"stat::number_of_executed_units: (\d+)", text)
        result = (f"ok; no leak in {checked[1]} corpus inputs" if code == 0 and checked
                  else f"LEAK CHECK FAILED (exit {code})")
    for crash in (WORK / "artifacts" / name).glob("*"):
        saved = SEEDS / name / f"failure-{hashlib.sha1(crash.read_bytes()).hexdigest()[:16]}"
        shutil.copyfile(crash, saved)
        crash.unlink()
        result += f"; input saved as {saved.relative_to(ROOT)}"
    if not result.startswith("ok"):
        result += f"; see {WORK / 'logs'}"
    rate = runs / seconds
    print(f"| {name} | {runs:,} | {seconds:.0f} | {rate:,.0f} | {cov} | {ft} | {corp} | {result} |",
          flush=True)
    return result.startswith("ok")


def _phase(name: str, env: dict[str, str], seconds: int, runs: int,
           leaks: bool = False) -> tuple[int, str]:
    """Fuzzes one target in a child process: a new `fuzz.py --child` where the extensions
    are sanitized, else forked from this one (`_forked`). Its exit code and output (also
    in the log)."""
    log = WORK / "logs" / f"{name}{'-leaks' if leaks else ''}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    if EXT_DIR_ENV not in env and hasattr(os, "fork"):
        return _forked(name, seconds, runs, log), log.read_text(errors="replace")
    if "ASAN_OPTIONS" in env:  # LeakSanitizer in the leak phase only, at exit too
        env = {**env, "ASAN_OPTIONS": f"{env['ASAN_OPTIONS']}:detect_leaks={int(leaks)}"}
    options = ["--seconds", str(seconds), "--runs", str(runs), *(["--leaks"] if leaks else [])]
    with log.open("w") as out:
        code = subprocess.run([sys.executable, __file__, "--child", name, "--work", str(WORK),
                               *options], env=env,
                              stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    return code, log.read_text(errors="replace")


def _forked(name: str, seconds: int, runs: int, log: Path) -> int:
    """Fuzz one target in a child forked from this process, which has imported and
    instrumented the modules once (`_prepare`): each child otherwise spent ~2 s of its
    ~3 s starting, 19 times. libFuzzer owns the child and exits it."""
    atheris = _prepare()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # libFuzzer exits it when done; getting back here is a failure
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            _fuzz(atheris, name, seconds, runs, leaks=False)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _child(name: str, seconds: int, runs: int, leaks: bool) -> int:
    """Fuzz one target in this process (libFuzzer owns it from here and exits).

    LeakSanitizer runs only with `leaks`: with Python's allocator on malloc it checks
    nearly every input, at a tenth of the speed, so the fuzzing phase goes without and a
    second phase replays the corpus with it.
    """
    # What is allocated before the first input is no input's leak, and LeakSanitizer cannot
    # see references held only by Python frames (3.11 keeps them in memory it does not
    # scan), such as this function's locals: it ignores what is allocated while disabled.
    lsan = ctypes.CDLL(None)
    sanitized = hasattr(lsan, "__lsan_disable")
    if sanitized:
        lsan.__lsan_disable()
    _fuzz(_prepare(), name, seconds, runs, leaks, lsan.__lsan_enable if sanitized else None)
    return 0


@functools.cache
def _prepare() -> Any:
    """atheris, with the decoders' modules imported (the sanitized build's extensions if
    `EXT_DIR_ENV` names them) and instrumented, once a process."""
    import atheris

    ext_dir = os.environ.get(EXT_DIR_ENV)
    if ext_dir:
        _load_extensions(Path(ext_dir))
    import fuzz_targets  # noqa: F401  (the targets' own imports, before instrumenting)

    from s2_spark._http import _h1, _h2_connection
    from s2_spark.wire import appends, durable, frames, records

    _instrument(atheris, (appends, durable, frames, records, _h1, _h2_connection))
    if ext_dir:  # the sanitized build, not the package's
        for module in (records._fastwire, appends._fastwire, durable._fastjson):
            assert Path(module.__file__).parent == Path(ext_dir), module.__file__
        _h1.fast_answer = records._fastwire.h1_response  # bound when _h1 was imported
    return atheris


def _fuzz(atheris: Any, name: str, seconds: int, runs: int, leaks: bool,
          after_setup: Callable[[], object] | None = None) -> None:
    """libFuzzer over one target, seeded from its corpus; exits the process when done."""
    import fuzz_targets

    artifacts = WORK / "artifacts" / name
    artifacts.mkdir(parents=True, exist_ok=True)
    argv = [sys.argv[0], f"-artifact_prefix={artifacts}/", "-max_len=8192", "-timeout=30",
            "-rss_limit_mb=4096", "-print_final_stats=1", f"-runs={runs}",
            f"-detect_leaks={int(leaks)}",
            str(WORK / "corpus" / name), str(SEEDS / name)]
    if seconds > 0:
        argv.append(f"-max_total_time={seconds}")
    atheris.Setup(argv, fuzz_targets.TARGETS[name])
    if after_setup is not None:
        after_setup()
    atheris.Fuzz()


# atheris keeps a reference to every comparison result that is not a bool, such as a numpy
# array: in functions that compare arrays, memory would grow with every input (and
# LeakSanitizer reports it), so these are left uninstrumented.
COMPARE_ARRAYS = {"split_json_array_numpy", "_escaped", "_check_shape", "_check_nesting",
                  "_split"}


def _instrument(atheris: Any, modules: tuple[ModuleType, ...]) -> None:
    """Python coverage for the fuzzer: every function and method the modules define (but
    `COMPARE_ARRAYS`) reports its branches and comparisons."""
    for module in modules:
        classes = [v for v in vars(module).values()
                   if isinstance(v, type) and v.__module__ == module.__name__]
        for owner in (module, *classes):
            for name, value in list(vars(owner).items()):
                if (inspect.isfunction(value) and value.__module__ == module.__name__
                        and name not in COMPARE_ARRAYS):
                    setattr(owner, name, atheris.instrument_func(value))


def _load_extensions(ext_dir: Path) -> None:
    """Import the extensions built in `ext_dir` under the package's module names, in place
    of the package's own build (which importing `s2_spark.wire` has loaded, if there is
    one): the codecs take theirs from `wire._accelerator` when they are imported."""
    from s2_spark.wire import _accelerator

    for name in SOURCES:
        path = ext_dir / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
        spec = importlib.util.spec_from_file_location(f"s2_spark.wire.{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[spec.name] = module
        setattr(_accelerator, name.lstrip("_"), module)


def _build(kind: str, flags: tuple[str, ...]) -> Path:
    """Both extensions compiled with `flags` into `.fuzz/build/<kind>/`."""
    compiler = "gcc" if kind == "gcov" else _clang()
    out = WORK / "build" / kind
    out.mkdir(parents=True, exist_ok=True)
    include = sysconfig.get_paths()["include"]
    for name, source in SOURCES.items():
        target = out / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
        subprocess.run([compiler, "-shared", "-fPIC", *flags, f"-I{include}", str(source),
                        "-o", str(target)], check=True, cwd=out)
    return out


def _clang() -> str:
    for name in ["clang", *(f"clang-{v}" for v in range(22, 13, -1))]:
        if shutil.which(name):
            return name
    sys.exit("--sanitize needs clang (apt-get install clang)")


def _sanitizer_env(ext_dir: Path) -> dict[str, str]:
    import atheris

    return {
        EXT_DIR_ENV: str(ext_dir),
        "LD_PRELOAD": str(Path(atheris.path()) / "asan_with_fuzzer.so"),
        "PYTHONMALLOC": "malloc",
        "ASAN_OPTIONS": "allocator_may_return_null=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }


def _coverage(names: list[str]) -> int:
    """Replay every seed and corpus input through a gcov build; print gcov's summary."""
    ext_dir = _build("gcov", ("--coverage", "-O0"))
    for data in ext_dir.glob("*.gcda"):
        data.unlink()
    replay = (
        "import sys, pathlib\n"
        f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "import fuzz\n"
        f"fuzz._load_extensions(pathlib.Path({str(ext_dir)!r}))\n"
        "from fuzz_targets import TARGETS\n"
        "for name in sys.argv[1:]:\n"
        f"    for d in ({str(SEEDS)!r}, {str(WORK / 'corpus')!r}):\n"
        "        for f in sorted(pathlib.Path(d, name).glob('*')):\n"
        "            TARGETS[name](f.read_bytes())\n"
    )
    subprocess.run([sys.executable, "-c", replay, *names], check=True, cwd=ROOT)
    for name in SOURCES:
        data = next(ext_dir.glob(f"*-{name}.gcda"))  # gcc names it after the output too
        report = subprocess.run(["gcov", "-b", "-n", data.name], cwd=ext_dir,
                                capture_output=True, text=True, check=True).stdout
        block = report.split(f"File '{SOURCES[name]}'\n")[1].split("File ")[0]
        print(f"{name}.c: " + "; ".join(block.strip().splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
