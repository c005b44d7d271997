"""How many rounds of random kills the exactly-once tests run: few in the suite (each
round starts a Spark of its own), as many as asked for a soak:
`S2_SPARK_SOAK_ROUNDS=10 python -m pytest -m spark tests/...`."""

from __future__ import annotations

import os

#: The one variable every kill test reads its round count from.
SOAK_ROUNDS = "S2_SPARK_SOAK_ROUNDS"


def soak_rounds(suite: int = 1) -> int:
    """Rounds to run: `S2_SPARK_SOAK_ROUNDS` when set (at least 1), else `suite`, the
    fewest that still cover the test's scenario."""
    value = os.environ.get(SOAK_ROUNDS, "").strip()
    return max(1, int(value)) if value else suite
