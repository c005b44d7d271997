"""Validation and query parameters of reads: start position, bounds, wait, clamp."""

from __future__ import annotations

import math
from typing import Any

from s2_spark.errors import S2BadRequestError

__all__ = ["check_u64", "read_params"]


def check_u64(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise S2BadRequestError(f"{name} must be an integer in [0, 2**64) (got {value!r})")
    return value


def read_params(
    *,
    seq_num: int | None,
    timestamp: int | None,
    tail_offset: int | None,
    count: int | None,
    bytes: int | None,
    until: int | None,
    clamp: bool,
    wait: float | None,
) -> dict[str, Any]:
    """S2 query parameters for a read; at most one start (none starts at the tail)."""
    starts = [
        n
        for n, v in (("seq_num", seq_num), ("timestamp", timestamp), ("tail_offset", tail_offset))
        if v is not None
    ]
    if len(starts) > 1:
        raise S2BadRequestError(
            f"a read takes at most one start position, got {', '.join(starts)}; pass one of "
            "seq_num, timestamp or tail_offset (none starts at the tail)"
        )
    params: dict[str, Any] = {}
    for name, value in (
        ("seq_num", seq_num),
        ("timestamp", timestamp),
        ("tail_offset", tail_offset),
        ("count", count),
        ("bytes", bytes),
        ("until", until),
    ):
        if value is not None:
            params[name] = check_u64(name, value)
    if clamp:
        params["clamp"] = "true"
    if wait is not None:
        if (
            isinstance(wait, bool)
            or not isinstance(wait, int | float)
            or not (wait >= 0 and math.isfinite(wait))
        ):
            raise S2BadRequestError(f"wait must be a number of seconds >= 0 (got {wait!r})")
        params["wait"] = wait_seconds(wait)
    if timestamp is not None and until is not None and until <= timestamp:
        raise S2BadRequestError(
            f"until ({until}) must be greater than the start timestamp ({timestamp})"
        )
    return params


def wait_seconds(wait: float) -> int:
    """S2 takes whole seconds; round up so a short wait never becomes 0 (no wait)."""
    return math.ceil(wait)
