"""Turn HTTP statuses, S2S terminal frames and transport failures into typed errors.

Every message names the operation's target (basin/stream), says what happened and what to
do. Request URLs and headers are never quoted, so an access token cannot leak.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from s2_spark._http import BodyDecodingError, Exchange, transport_error
from s2_spark.errors import (
    AlreadyExistsError,
    FencingTokenMismatchError,
    Position,
    ReadPastTailError,
    S2BadRequestError,
    S2Error,
    S2NotFoundError,
    S2RateLimitedError,
    S2UnauthorizedError,
    S2UnavailableError,
    SeqNumMismatchError,
    ServiceError,
)

__all__ = ["error_from_body", "error_from_decoding", "error_from_status", "error_from_transport",
           "is_retryable"]

_RETRYABLE_409_CODES = frozenset({"transaction_conflict"})


def _parse(body: bytes | str) -> dict[str, Any]:
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return {"message": text[:500]}
    return parsed if isinstance(parsed, dict) else {"message": str(parsed)[:500]}


def error_from_body(status: int, body: bytes | str, target: str) -> S2Error:
    """Map an error status and its (JSON) body to the matching S2Error subclass."""
    return error_from_status(status, _parse(body), target)


def error_from_status(status: int, info: dict[str, Any], target: str) -> S2Error:
    """Map an error status and its parsed body to the matching S2Error subclass."""
    code = info.get("code") if isinstance(info.get("code"), str) else None
    detail = info.get("message")
    said = f": {detail}" if isinstance(detail, str) and detail else ""
    where = f" ({code})" if code else ""

    if status == 412:
        failed = _condition_failed(info, target)
        if failed is not None:
            return failed
    if status == 416:
        raw_tail = info.get("tail")
        tail: dict[str, Any] = raw_tail if isinstance(raw_tail, dict) else {}
        pos = Position(int(tail.get("seq_num", 0)), int(tail.get("timestamp", 0)))
        return ReadPastTailError(
            f"read of {target} starts beyond the tail (tail seq_num {pos.seq_num}); start "
            f"at or before the tail, or pass clamp=True to start at the tail",
            tail=pos,
        )
    if status in (400, 422):
        return S2BadRequestError(
            f"S2 rejected the request for {target} as invalid{where}{said}; fix the request",
            status=status,
            code=code,
        )
    if status in (401, 403):
        return S2UnauthorizedError(
            f"S2 denied access to {target} (HTTP {status}{where}){said}; check the access "
            "token (S2_ACCESS_TOKEN) and its permissions",
            status=status,
            code=code,
        )
    if status == 404:
        return S2NotFoundError(
            f"{target} was not found{where}{said}; create it first or check the name",
            status=status,
            code=code,
        )
    if status == 409:
        return _conflict(code, target, f"{where}{said}")
    if status == 429:
        return S2RateLimitedError(
            f"S2 rate-limited the request for {target}{where}{said}; slow down and retry",
            status=status,
            code=code,
        )
    if status == 408 or status >= 500:
        return S2UnavailableError(
            f"S2 could not serve {target} right now (HTTP {status}{where}){said}; retry later",
            status=status,
            code=code,
        )
    return S2Error(f"S2 answered HTTP {status} for {target}{where}{said}", status=status, code=code)


def _condition_failed(info: dict[str, Any], target: str) -> S2Error | None:
    """A 412 naming the append condition that failed, or None when it names none."""
    if "seq_num_mismatch" in info:
        expected = int(info["seq_num_mismatch"])
        return SeqNumMismatchError(
            f"append to {target} rejected: match_seq_num did not equal the stream's tail "
            f"(the next seq_num is {expected}); re-read the tail and retry with "
            f"match_seq_num={expected} if the append is still wanted",
            expected_seq_num=expected,
        )
    if "fencing_token_mismatch" in info:
        token = str(info["fencing_token_mismatch"])
        return FencingTokenMismatchError(
            f"append to {target} rejected: the stream is fenced with another token "
            f"({token!r}); another writer owns it, stop writing or fence it again",
            expected_token=token,
        )
    return None


def _conflict(code: str | None, target: str, said: str) -> S2Error:
    """A 409: a transient transaction conflict (retried), else the resource exists."""
    if code in _RETRYABLE_409_CODES:
        return S2UnavailableError(
            f"S2 hit a transient conflict on {target}{said}; retry", status=409, code=code
        )
    what = "already exists" if code in (None, "resource_already_exists") else "conflicts"
    return AlreadyExistsError(
        f"{target} {what}{said}; use ensure_* to accept an existing resource, "
        "or wait for a pending deletion to finish",
        status=409,
        code=code,
    )


def error_from_transport(
    exc: httpx.TransportError,
    target: str,
    what: str = "request",
    exchange: Exchange | None = None,
    *,
    streamed: bool = False,
) -> ServiceError:
    """An httpx transport failure: retryable `S2UnavailableError` (with `unsent` and
    `stale_connection` from the exchange's trace), or `TlsError` for TLS misconfiguration."""
    return transport_error(exc, exchange, target, what, S2UnavailableError, streamed=streamed)


def error_from_decoding(exc: BodyDecodingError, target: str) -> S2Error:
    """An answer whose body does not decode by its Content-Encoding (corrupt, cut short,
    an encoding not asked for): not retried, as S2's SDK does not; `status` 0, since the
    answer's own status cannot be trusted to mean what it says."""
    err = S2Error(
        f"S2's answer for {target} could not be read: {exc}. The server or a proxy on the "
        "way sent a broken compressed body; if it persists, ask for uncompressed answers "
        "(option compression=none, S2Config(compression='none'))",
        code="response_compression",
    )
    err.__cause__ = exc
    return err


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, S2Error) and exc.retryable
