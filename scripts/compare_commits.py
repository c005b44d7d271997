"""Run benchmarks for an earlier commit and for this tree, alternately, on this machine.

    python scripts/compare_commits.py ab7c68d latency.py
    python scripts/compare_commits.py ab7c68d "latency.py --duration 30" spark_read.py --runs 3

A figure measured once, weeks ago, on another load says little about a change; the same
benchmark run for both versions minutes apart does. The earlier commit is checked out into
a temporary git worktree (its C accelerator built in place; the Durable Streams server's
`node_modules` shared with this tree), and every benchmark runs `--runs` times for each
side, the sides alternating (ABBA order, so drifting load falls on both alike), with this
interpreter and its packages and each side's own `s2_spark` and `benchmarks/` first on
`PYTHONPATH` (Spark's Python workers inherit it). Each side runs its own version of the
benchmark with the same arguments; with `--this-benchmarks`, both run this tree's (only
the package differs: for an earlier commit whose API the benchmark still fits, to compare
with what a newer benchmark measures).

Benchmarks that can pin the server to its own CPU (`benchmarks/_pinning.py`) do so when
both sides can; where one side cannot, both run unpinned (`--no-pin` is passed to the one
that can), and `--no-pin` here makes both run unpinned.

Figures are read from each run's summary lines (those that start with the benchmark's
name, e.g. `latency:` or `latency at 1,000 streams:`): every comma- or semicolon-separated
part with a number is one figure, named by its text with the first number left out. The
table gives each figure's median per side, the ratio this tree / the earlier commit, and
every run's value; the load average is printed before each run. A figure absent from one
side (a new one) shows as `-`.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A figure's number: not part of a word such as `p50` or of `1000x100`'s second half.
NUMBER = re.compile(r"(?<![A-Za-z\d.])-?\d[\d,]*(?:\.\d+)?")
MODE = re.compile(r"\s*\((?:pinned|unpinned)\)$")  # how a benchmark says it ran


@contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """`commit` checked out (detached) in a temporary worktree, removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="s2-compare-"))
    tree = tmp / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
                   check=True, capture_output=True, text=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=False, capture_output=True)
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


def prepare(tree: Path) -> None:
    """Build the C accelerator in place (without it the pure-Python decoders would be
    measured) and share this tree's Durable Streams server install."""
    # Since 0.2.0 setup.py declares the extensions; before, pyproject.toml did.
    setup = ["setup.py"] if (tree / "setup.py").exists() else [
        "-c", "from setuptools import setup; setup()"]
    built = subprocess.run([sys.executable, *setup, "build_ext", "--inplace"],
                           cwd=tree, capture_output=True, text=True)
    if built.returncode != 0:
        print(f"warning: the C accelerator did not build for {tree}: the earlier commit runs "
              f"its pure-Python decoders\n{built.stderr[-2000:]}")
    modules = ROOT / "tests" / "durable_server" / "node_modules"
    theirs = tree / "tests" / "durable_server" / "node_modules"
    if modules.is_dir() and theirs.parent.is_dir() and not theirs.exists():
        theirs.symlink_to(modules)


def can_pin(benchmarks: Path, script: str) -> bool:
    """Whether a side's benchmark takes `--no-pin` (`benchmarks/_pinning.py`); a side
    without the benchmark does not count."""
    path = benchmarks / script
    return not path.exists() or "add_pin_option" in path.read_text()


def run(tree: Path, command: list[str], label: str, log: Path, benchmarks: Path) -> list[str]:
    """One run of `command` (a script in `benchmarks` and its arguments) with `tree`'s
    package; its output goes to `log`, and its summary lines are returned."""
    script = command[0]
    if not (benchmarks / script).exists():
        print(f"{label}: no benchmarks/{script} at this side")
        return []
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(tree), str(tree / "benchmarks"), env.get("PYTHONPATH")]))
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"[{time.strftime('%H:%M:%S')}] load {load:.2f}: {label}: {shlex.join(command)}",
          flush=True)
    with log.open("w") as out:
        done = subprocess.run([sys.executable, str(benchmarks / script), *command[1:]],
                              cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    lines = log.read_text().splitlines()
    if done.returncode != 0:
        print(f"  failed (exit {done.returncode}); the end of {log}:")
        print("\n".join(f"    {line}" for line in lines[-15:]))
        return []
    name = Path(script).stem
    summary = [line for line in lines if re.match(rf"{re.escape(name)}[: ]", line)]
    for line in summary:
        print(f"  {line}")
    return summary


def figures(lines: list[str]) -> dict[str, float]:
    """Figure name -> value: each comma- or semicolon-separated part of a summary line
    that holds a number; the name is the line's lead and the part, its first number
    replaced by `#`."""
    out: dict[str, float] = {}
    for line in lines:
        lead, _, rest = MODE.sub("", line).partition(":")
        for part in re.split(r"[,;]\s+|\s+\(", rest.strip().rstrip(")")):
            match = NUMBER.search(part)
            if match is None:
                continue
            name = f"{lead}: {part[:match.start()]}#{part[match.end():]}".strip()
            out[name] = float(match.group().replace(",", ""))
    return out


def table(base: str, results: dict[str, dict[str, list[dict[str, float]]]]) -> None:
    for bench, sides in results.items():
        names: list[str] = []
        for runs in sides.values():
            for figs in runs:
                names += [n for n in figs if n not in names]
        print(f"\n{bench}: median of each side's runs (every run's value in brackets)")
        print(f"{'figure':60s} {base[:12]:>12s} {'this tree':>12s} {'this/base':>10s}")
        for name in names:
            values = {side: [f[name] for f in runs if name in f] for side, runs in sides.items()}
            med = {side: statistics.median(v) if v else None for side, v in values.items()}
            b, c = med["base"], med["this tree"]
            ratio = f"{c / b:.2f}" if b and c is not None else "-"
            every = "; ".join(f"{side} " + " ".join(f"{x:g}" for x in v)
                              for side, v in values.items())
            print(f"{name[:60]:60s} {_num(b):>12s} {_num(c):>12s} {ratio:>10s}  [{every}]")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("commit", help="the earlier commit (any git revision)")
    ap.add_argument("benchmarks", nargs="+",
                    help='benchmark scripts under benchmarks/, each with its arguments in one '
                         'quoted word ("latency.py --duration 30")')
    ap.add_argument("--runs", type=int, default=3, help="runs of each benchmark per side")
    ap.add_argument("--no-pin", action="store_true", help="run every benchmark unpinned")
    ap.add_argument("--this-benchmarks", action="store_true",
                    help="both sides run this tree's benchmark scripts (only the package "
                         "differs)")
    ap.add_argument("--logs", type=Path, default=None,
                    help="folder for each run's full output (default: a temporary one)")
    args = ap.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="s2-compare-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"full outputs in {logs}")
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    with worktree(args.commit) as old:
        prepare(old)
        trees = {"base": old, "this tree": ROOT}
        scripts = {side: (ROOT if args.this_benchmarks else t) / "benchmarks"
                   for side, t in trees.items()}
        for bench in args.benchmarks:
            command = shlex.split(bench)
            script = command[0]
            pin = not args.no_pin and all(can_pin(b, script) for b in scripts.values())
            commands = {side: command + ([] if pin or not (b / script).exists()
                                         or not can_pin(b, script) else ["--no-pin"])
                        for side, b in scripts.items()}
            print(f"\n{bench}: {'pinned' if pin else 'unpinned'}, {args.runs} runs per side")
            sides: dict[str, list[dict[str, float]]] = {side: [] for side in trees}
            for i in range(args.runs):
                order = list(trees) if i % 2 == 0 else list(trees)[::-1]
                for side in order:
                    log = logs / f"{Path(command[0]).stem}-{side.replace(' ', '-')}-{i + 1}.log"
                    lines = run(trees[side], commands[side], f"{side} run {i + 1}", log,
                                scripts[side])
                    sides[side].append(figures(lines))
            results[bench] = sides
    table(args.commit, results)


if __name__ == "__main__":
    main()
