"""The wire decoders' fuzz targets (tests/fuzz_targets.py): the corpus kept in the
repository replayed input by input (the seeds, and every input that ever failed a target),
and a short coverage-guided run of every target, as `scripts/fuzz.py` runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_targets import TARGETS

from s2_spark.wire import appends, durable, records

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "fuzz"
CASES = sorted(CORPUS.glob("*/*"))


def test_the_c_paths_are_built() -> None:
    """Without the extensions the targets would compare Python with itself."""
    assert (records.IMPLEMENTATION, appends.IMPLEMENTATION, durable.IMPLEMENTATION) == (
        "c", "c", "c")


def test_every_target_has_seeds() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(TARGETS)
    assert all(any(CORPUS.glob(f"{name}/seed-*")) for name in TARGETS)


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name}" for p in CASES])
def test_corpus_case(case: Path) -> None:
    TARGETS[case.parent.name](case.read_bytes())


def test_short_fuzz_run_of_every_target(tmp_path: Path) -> None:
    """A few thousand inputs per target, coverage-guided (what CI runs; the long runs under
    a sanitizer are in docs/reliability.md)."""
    pytest.importorskip("atheris")
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz.py"), "--runs", "3000",
         "--work", str(tmp_path)],
        capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0][2:] for row in rows] == list(TARGETS)
    assert all(" | 3,000 | " in row and row.endswith("| ok |") for row in rows), run.stdout
