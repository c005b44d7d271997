"""examples/durable_streams_pipeline.py runs as documented against the reference server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "durable_streams_pipeline.py"


def test_example_copies_large_orders_exactly_once(ds_server: Any, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--base-url", ds_server.url],
        cwd=tmp_path,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("large orders: "))
    # Two AvailableNow runs on one checkpoint: each order of 100 or more, once, in order.
    assert json.loads(line.removeprefix("large orders: ")) == [
        {"id": i, "amount": 40 * i} for i in range(3, 8)
    ]
