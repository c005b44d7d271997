"""S2's error codes: each code's HTTP status, whether a retry may succeed, and whether S2
guarantees that the failed operation had no side effect. Every retry decision of the S2
client is made from this table.

Taken from S2's own source (repository s2-streamstore/s2): `ErrorCode`, `status()`,
`is_retryable()` and `has_no_side_effects()` in `api/src/v1/error.rs`, applied to an
answer as S2's SDK applies them (`server_error_is_retryable` and
`server_error_has_no_side_effects` in `sdk/src/error.rs`):

* a known code answered with its own status is classified by the table;
* a known code with another status fails closed: neither retried nor side-effect free;
* an unknown code (a newer server's, or none: a proxy's 502 page) falls back to its
  status: 408, 429, 500, 502, 503 and 504 are retried, and none is side-effect free.

Side-effect free matters for appends without a condition: an append answered with a code
that is not (503 `unavailable`, 500 `other`, 504 `upstream_timeout`, ...) may have landed,
so it is not sent again (that could duplicate records); one answered 429 `rate_limited`,
502 `hot_server`, 503 `server_draining` or 409 `transaction_conflict` provably did
nothing, and is retried like a read. An answer's `retry-after-ms` header (milliseconds)
says how long to wait at least before the retry, as the SDK honours it (`sdk/src/api.rs`).

412 (an append condition failed) and 416 (a read past the tail) carry no code; S2's SDK
treats them as neither retryable nor side-effect free.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ERROR_CODES",
    "RETRY_AFTER_HEADER",
    "ErrorCode",
    "has_no_side_effects",
    "is_retryable",
    "retry_after_seconds",
]

#: The header an S2 answer names its wanted pause in (integer milliseconds).
RETRY_AFTER_HEADER = "retry-after-ms"

#: Statuses an unknown code (or none) is retried on (S2's SDK, `server_error_is_retryable`).
_RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class ErrorCode:
    """One of S2's error codes: its `status`, whether retrying may succeed
    (`retryable`), and whether S2 guarantees the operation had no side effect
    (`no_side_effects`)."""

    code: str
    status: int
    retryable: bool
    no_side_effects: bool


def _table(*rows: tuple[str, int, bool, bool]) -> dict[str, ErrorCode]:
    return {code: ErrorCode(code, status, retry, pure) for code, status, retry, pure in rows}


#: Every code of `api/src/v1/error.rs` (alphabetical there and here):
#: (code, status, retryable, no side effects).
ERROR_CODES: dict[str, ErrorCode] = _table(
    ("access_token_not_found", 404, False, True),
    ("authn", 401, False, True),
    ("bad_frame", 400, False, True),
    ("bad_header", 400, False, True),
    ("bad_json", 400, False, True),
    ("bad_path", 400, False, True),
    ("bad_proto", 400, False, True),
    ("bad_query", 400, False, True),
    ("basin_deletion_pending", 409, False, True),
    ("basin_not_found", 404, False, True),
    ("client_hangup", 499, False, False),
    ("decryption_failed", 400, False, True),
    ("hot_server", 502, True, True),
    ("invalid", 422, False, True),
    ("not_implemented", 501, False, True),
    ("other", 500, True, False),
    ("permission_denied", 403, False, True),
    ("quota_exhausted", 403, False, True),
    ("rate_limited", 429, True, True),
    ("request_timeout", 408, True, False),
    ("resource_already_exists", 409, False, True),
    ("server_draining", 503, True, True),
    ("storage", 500, True, False),
    ("stream_deletion_pending", 409, False, True),
    ("stream_not_found", 404, False, True),
    ("transaction_conflict", 409, True, True),
    ("unavailable", 503, True, False),
    ("upstream_timeout", 504, True, False),
)


def is_retryable(status: int, code: str | None) -> bool:
    """Whether an answer of `status` with `code` may succeed when asked again."""
    known = ERROR_CODES.get(code) if code is not None else None
    if known is None:
        return status in _RETRYABLE_STATUSES
    return known.status == status and known.retryable


def has_no_side_effects(status: int, code: str | None) -> bool:
    """Whether S2 guarantees that an operation answered so changed nothing (only a known
    code with its own status can say so)."""
    known = ERROR_CODES.get(code) if code is not None else None
    return known is not None and known.status == status and known.no_side_effects


def retry_after_seconds(value: str | None) -> float | None:
    """The pause a `retry-after-ms` header asks for, in seconds; None when there is none
    or it is not a whole number of milliseconds (the SDK ignores such a value too)."""
    if value is None:
        return None
    text = value.strip()
    if not text.isdigit():
        return None
    return int(text) / 1000.0
