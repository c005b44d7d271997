"""Run the Spark tests on every supported PySpark, and the suite on the lowest dependencies.

    python scripts/version_matrix.py                 # 4.0, 4.1, 4.2, 4.3 and lowest
    python scripts/version_matrix.py 4.0 lowest      # a subset

Each target gets its own virtualenv under `.matrix/` made with uv (installed into the
running interpreter if missing). A PySpark target first installs "the platform" (that
PySpark with its Connect client, pandas and numpy), then s2-spark as a regular,
non-editable package with its test tools, and fails if that replaced PySpark, pandas or
numpy: this is what `pip install s2-spark` into an existing Spark does. The tests then
import the installed package, not the checkout. The CI suite runs on one PySpark only;
this script is the rest of the compatibility proof. Prints one Markdown row per target
(installed versions, what the install changed, pytest's summary); exits non-zero if any
target failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".matrix"
SHOWN = ("pyspark", "pandas", "numpy", "pyarrow", "protobuf", "httpx", "zstandard")


KEPT = ("pyspark", "pandas", "numpy")  # a platform's own; installing s2-spark must keep them


@dataclass(frozen=True)
class Target:
    name: str
    requirements: tuple[str, ...]
    platform: tuple[str, ...] = ()
    resolution: str = "highest"
    # Test files that need the `dev` extra (s2-sdk, grpcio-tools), which the lowest run
    # leaves out: s2-sdk needs protobuf 6, above the declared floor.
    ignore: tuple[str, ...] = ()
    spark_only: bool = True


def _spark(version: str) -> Target:
    return Target(
        version.rsplit(".", 1)[0],
        requirements=(".[test]",),
        # pyyaml: spark-pipelines' (4.1+) own dependency, for the pipelines example.
        platform=(f"pyspark[connect]=={version}", "pandas<3", "pyyaml"),
    )


TARGETS = {
    t.name: t
    for t in (
        _spark("4.0.5"),
        _spark("4.1.4"),
        _spark("4.2.1"),
        _spark("4.3.0"),
        Target(
            "lowest",
            requirements=(".[spark,test]",),
            resolution="lowest-direct",
            ignore=("test_sdk_conformance.py", "test_durability.py", "test_proto.py"),
            spark_only=False,
        ),
    )
}


def _uv() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "uv"], check=True)
    return [sys.executable, "-m", "uv"]


def _install(target: Target) -> tuple[Path, str]:
    """The target's venv; and what installing s2-spark changed of the platform."""
    venv = WORK / target.name
    shutil.rmtree(venv, ignore_errors=True)
    uv = _uv()
    subprocess.run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"

    def install(*requirements: str) -> None:
        subprocess.run(
            [*uv, "pip", "install", "-q", "--python", str(python),
             "--resolution", target.resolution, *requirements],
            cwd=ROOT,
            check=True,
        )

    if target.platform:
        install(*target.platform)
    before = _versions(python)
    install(*target.requirements)
    after = _versions(python)
    changed = {n: f"{before[n]}->{after[n]}" for n in after if before.get(n) != after[n]}
    if target.platform:
        replaced = [n for n in KEPT if n in changed]
        if replaced:
            raise SystemExit(f"{target.name}: installing s2-spark replaced {replaced}: {changed}")
    return python, ", ".join(f"{n} {v}" for n, v in changed.items()) or "nothing"


def _versions(python: Path) -> dict[str, str]:
    code = (
        "import json\n"
        "from importlib.metadata import PackageNotFoundError, version\n"
        "def v(n):\n"
        "    try:\n"
        "        return version(n)\n"
        "    except PackageNotFoundError:\n"
        "        return '-'\n"
        f"print(json.dumps({{n: v(n) for n in {SHOWN!r}}}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout))


def _test_files(target: Target) -> list[str]:
    pattern = "test_spark_*.py" if target.spark_only else "test_*.py"
    files = sorted(p.name for p in (ROOT / "tests").glob(pattern))
    if target.spark_only:  # the deployment tests run real Spark too
        for extra in ("test_durable_spark_*.py", "test_deploy_*.py", "test_lag.py",
                      "test_options_declared.py", "test_checkpoint_compat.py"):
            files += sorted(p.name for p in (ROOT / "tests").glob(extra))
    return [str(ROOT / "tests" / name) for name in files if name not in target.ignore]


def _run_tests(target: Target, python: Path, log: Path) -> tuple[bool, str]:
    # From a directory outside the checkout, through the venv's pytest script: Python puts
    # the working directory first on sys.path for `python -m ...` (Spark starts its
    # workers that way), and the tests must import the installed package, not the source.
    pytest = python.parent / "pytest"
    env = {**os.environ, "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    elsewhere = WORK / f"{target.name}-cwd"
    elsewhere.mkdir(exist_ok=True)
    with log.open("w") as out:
        done = subprocess.run(
            [str(pytest), "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
             "-c", str(ROOT / "pyproject.toml"), *_test_files(target)],
            cwd=elsewhere, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    lines = log.read_text().strip().splitlines()
    summary = next(
        (ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)),
        f"pytest exited {done.returncode}",
    )
    return done.returncode == 0, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"any of {', '.join(TARGETS)} (default: all)")
    names = parser.parse_args().targets or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {unknown}: choose from {', '.join(TARGETS)}")
    WORK.mkdir(exist_ok=True)
    rows, ok = [], True
    for name in names:
        target = TARGETS[name]
        began = time.monotonic()
        python, changed = _install(target)
        passed, summary = _run_tests(target, python, WORK / f"{name}.log")
        ok &= passed
        minutes = (time.monotonic() - began) / 60
        installed = " ".join(f"{n}={v}" for n, v in _versions(python).items())
        row = (f"| {name} | {'pass' if passed else 'FAIL'} | {summary} | {installed} | "
               f"{changed} | {minutes:.1f} min |")
        print(row, flush=True)
        rows.append(row)
    header = (
        "| target | result | tests | installed | s2-spark's install changed | time |\n"
        "|---|---|---|---|---|---|"
    )
    (WORK / "results.md").write_text("\n".join([header, *rows]) + "\n")
    print(f"\n{header}\n" + "\n".join(rows))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
