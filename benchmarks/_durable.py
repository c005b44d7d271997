"""Shared set-up of the Durable Streams benchmarks: the reference server, test data, the peer."""

from __future__ import annotations

import json
import random
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from durable_testbed import DurableServer

__all__ = ["DurableServer", "messages", "require_peer"]


def messages(n: int, size: int = 100) -> list[str]:
    """n JSON object texts of about `size` bytes, with varied (poorly compressible) values."""
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits
    out = []
    for i in range(n):
        pad = "".join(rng.choices(alphabet, k=max(size - 45, 1)))
        out.append(json.dumps({"id": i, "kind": "click", "pad": pad}, separators=(",", ":")))
    return out


def require_peer() -> None:
    """The peer is the `durable-streams` package from PyPI, not a dependency of s2-spark."""
    try:
        import durable_streams  # noqa: F401
    except ImportError:
        sys.exit(
            "this benchmark compares against the durable-streams package from PyPI; install "
            "it first: pip install durable-streams==0.1.0 (the dev extra has it)"
        )
