"""S2's rules for the records of one append: batch limits, command records, fencing tokens.

Checked before anything is sequenced, so a batch that breaks a rule (a 422 `invalid`,
in S2's wording) changes nothing. A command record is a record whose only header has an
empty name; its value names the command (`fence`, `trim`) and its body the argument.
"""

from __future__ import annotations

from typing import Any

from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.records import (
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    MAX_FENCING_TOKEN_BYTES,
)

__all__ = ["AppendRecord", "command_effect", "validate_fencing_token", "validate_records"]

# (timestamp or None, headers, body)
AppendRecord = tuple[int | None, list[tuple[bytes, bytes]], bytes]


def validate_records(records: list[AppendRecord]) -> None:
    """S2's batch rules: 1-1000 records, each and all <= 1 MiB metered, valid commands."""
    if not records:
        raise ApiError.invalid("record batch must not be empty")
    if len(records) > MAX_BATCH_RECORDS:
        raise ApiError.invalid("record batch must not exceed 1000 records")
    if not any(r[1] for r in records):
        # No headers, so no command records: sizes are 8 + body length.
        lengths = [len(r[2]) for r in records]
        if max(lengths) + 8 > MAX_BATCH_BYTES:
            raise ApiError.invalid("record must have metered size less than 1 MiB")
        if sum(lengths) + 8 * len(lengths) > MAX_BATCH_BYTES:
            raise ApiError.invalid("record batch must not exceed a metered size of 1 MiB")
        return
    total = 0
    for _, headers, body in records:
        size = 8 + len(body)
        if headers:
            for name, value in headers:
                size += 2 + len(name) + len(value)
            for name, _ in headers:
                if not name:
                    _validate_command(headers, body)
                    break
        if size > MAX_BATCH_BYTES:
            raise ApiError.invalid("record must have metered size less than 1 MiB")
        total += size
    if total > MAX_BATCH_BYTES:
        raise ApiError.invalid("record batch must not exceed a metered size of 1 MiB")


def _validate_command(headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    if len(headers) != 1:
        raise ApiError.invalid("invalid header: empty name")
    op = headers[0][1]
    if op == b"fence":
        try:
            token = body.decode()
        except UnicodeDecodeError as e:
            raise ApiError.invalid("invalid `fence` command: invalid UTF-8") from e
        if len(token.encode()) > MAX_FENCING_TOKEN_BYTES:
            raise ApiError.invalid(
                f"invalid `fence` command: fencing token must not exceed "
                f"{MAX_FENCING_TOKEN_BYTES} bytes in length"
            )
    elif op == b"trim":
        if len(body) != 8:
            raise ApiError.invalid(
                f"invalid `trim` command: earliest sequence number to trim to was "
                f"{len(body)} bytes, must be 8"
            )
    else:
        raise ApiError.invalid("unknown command")


def validate_fencing_token(token: str | None) -> None:
    if token is not None and len(token.encode()) > MAX_FENCING_TOKEN_BYTES:
        raise ApiError.invalid(
            f"fencing token must not exceed {MAX_FENCING_TOKEN_BYTES} bytes in length"
        )


def command_effect(record: AppendRecord) -> tuple[str, Any]:
    """What a (validated) command record does: ("fence", token) or ("trim", seq_num)."""
    _, headers, body = record
    op = headers[0][1]
    if op == b"fence":
        return "fence", body.decode()
    return "trim", int.from_bytes(body, "big")
