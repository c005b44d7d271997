"""Turn HTTP statuses, S2S terminal frames and transport failures into typed errors.

The class says what went wrong (by status, and by code where S2's codes tell more); the
error's `retryable` and `unsent` (the call provably had no effect) come from S2's table
of error codes (`_error_codes`), and `retry_after` from an answer's `retry-after-ms`.
Every message names the operation's target (basin/stream), says what happened and what to
do. Request URLs and headers are never quoted, so an access token cannot leak.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from s2_spark._http import (
    BodyDecodingError,
    BodyTooLargeError,
    Exchange,
    Response,
    transport_error,
)
from s2_spark.errors import (
    AlreadyExistsError,
    DeletionPendingError,
    EncryptionKeyError,
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

from ._error_codes import (
    RETRY_AFTER_HEADER,
    has_no_side_effects,
    is_retryable,
    retry_after_seconds,
)

__all__ = ["error_from_body", "error_from_decoding", "error_from_response",
           "error_from_status", "error_from_transport"]

#: 409 codes that say the basin or stream is being deleted.
_DELETION_PENDING = frozenset({"stream_deletion_pending", "basin_deletion_pending"})


def _parse(body: bytes | str) -> dict[str, Any]:
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return {"message": text[:500]}
    return parsed if isinstance(parsed, dict) else {"message": str(parsed)[:500]}


def error_from_response(resp: Response, target: str) -> S2Error:
    """The error an unsuccessful answer (read whole) stands for, with the pause its
    `retry-after-ms` header asks for."""
    return error_from_body(resp.status_code, resp.content, target, resp.headers)


def error_from_body(status: int, body: bytes | str, target: str,
                    headers: Mapping[str, str] | None = None) -> S2Error:
    """Map an error status and its (JSON) body to the matching S2Error subclass; `headers`
    (the answer's) may carry `retry-after-ms`."""
    err = error_from_status(status, _parse(body), target)
    if headers is not None:
        err.retry_after = retry_after_seconds(headers.get(RETRY_AFTER_HEADER))
    return err


def error_from_status(status: int, info: dict[str, Any], target: str) -> S2Error:
    """Map an error status and its parsed body to the matching S2Error subclass, retryable
    and side-effect free as S2's table of error codes says."""
    code = info.get("code") if isinstance(info.get("code"), str) else None
    err = _classified(status, code, info, target)
    err.retryable = is_retryable(status, code)
    err.unsent = has_no_side_effects(status, code)
    return err


def _classified(status: int, code: str | None, info: dict[str, Any], target: str) -> S2Error:
    """The class (and message) of an answer: what went wrong, by status and code."""
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
    if status == 400 and _about_the_key(code, detail):
        return _key_error(code, target, f"{where}{said}")
    if status in (400, 422):
        return S2BadRequestError(
            f"S2 rejected the request for {target} as invalid{where}{said}; fix the request",
            status=status,
            code=code,
        )
    if status in (401, 403):
        advice = ("the account's quota is used up: raise it, or wait for it to renew"
                  if code == "quota_exhausted" else "check the access token "
                  "(S2_ACCESS_TOKEN) and its permissions")
        return S2UnauthorizedError(
            f"S2 denied access to {target} (HTTP {status}{where}){said}; {advice}",
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
    if status == 501:
        return S2Error(
            f"S2 does not implement the request for {target} (HTTP 501{where}){said}; this "
            "server cannot do it (s2-lite leaves some of S2's API out)",
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


def _about_the_key(code: str | None, detail: object) -> bool:
    """A 400 about the encryption key: records that do not decrypt, or the key header
    refused (s2-lite says "encryption key" in each such message, never the key)."""
    return code == "decryption_failed" or (
        code == "bad_header" and isinstance(detail, str)
        and ("encryption key" in detail or "s2-encryption-key" in detail)
    )


def _key_error(code: str | None, target: str, said: str) -> S2Error:
    if code == "decryption_failed":
        return EncryptionKeyError(
            f"records of {target} could not be decrypted with the encryption key given"
            f"{said}: the key is wrong. Read with the key the records were appended with "
            "(S2 does not check the key on append)",
            status=400,
            code=code,
        )
    return EncryptionKeyError(
        f"{target} is encrypted and S2 refused the request for its key{said}; pass the "
        "key its records are appended with (base64 of 32 bytes)",
        status=400,
        code=code,
    )


def _conflict(code: str | None, target: str, said: str) -> S2Error:
    """A 409: a transient transaction conflict (retried), a deletion in progress (gone),
    else the resource exists."""
    if code == "transaction_conflict":
        return S2UnavailableError(
            f"S2 hit a transient conflict on {target}{said}; retry", status=409, code=code
        )
    if code in _DELETION_PENDING:
        return DeletionPendingError(
            f"{target} is being deleted{said}: it can no longer be read, appended to or "
            "created again; once S2 has removed it (shortly) its name is free to create "
            "anew",
            status=409,
            code=code,
        )
    what = "already exists" if code in (None, "resource_already_exists") else "conflicts"
    return AlreadyExistsError(
        f"{target} {what}{said}; use ensure_* to accept an existing resource",
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
    an encoding not asked for) or is longer than its call takes: not retried, as S2's SDK
    does not; `status` 0, since the answer's own status cannot be trusted to mean what it
    says."""
    if isinstance(exc, BodyTooLargeError):
        err = S2Error(
            f"S2's answer for {target} was not read: {exc}, the most this call holds of an "
            "answer (S2's own answers to it are far smaller; reads of more go through read "
            "sessions, which take any length as it comes). The server or a proxy on the way "
            "sent something else, so the call was not retried",
            code="response_too_large",
        )
        err.__cause__ = exc
        return err
    err = S2Error(
        f"S2's answer for {target} could not be read: {exc}. The server or a proxy on the "
        "way sent a broken compressed body; if it persists, ask for uncompressed answers "
        "(option compression=none, S2Config(compression='none'))",
        code="response_compression",
    )
    err.__cause__ = exc
    return err
