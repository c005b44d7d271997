"""Turn Durable Streams answers and transport failures into typed errors.

Messages name the stream (its path, never the query or headers), say what happened and
what to do.
"""

from __future__ import annotations

import httpx

from s2_spark._http import (
    BodyDecodingError,
    BodyTooLargeError,
    Exchange,
    Response,
    transport_error,
)
from s2_spark.errors import (
    DurableStreamsError,
    MalformedResponseError,
    OffsetGoneError,
    SequenceGapError,
    ServiceError,
    StaleEpochError,
    StreamBadRequestError,
    StreamClosedError,
    StreamConflictError,
    StreamNotFoundError,
    StreamRateLimitedError,
    StreamUnauthorizedError,
    StreamUnavailableError,
)

__all__ = ["error_from_decoding", "error_from_response", "error_from_transport", "header_int"]


def header_int(resp: Response, name: str) -> int | None:
    """An integer response header, None when absent; malformed when not an integer."""
    raw = resp.headers.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise MalformedResponseError(
            f"the server sent a non-integer {name} header: {raw[:40]!r}",
            status=resp.status_code,
            code="bad_header",
        ) from None


def _said(resp: Response) -> str:
    try:
        text = resp.text.strip()
    except (httpx.ResponseNotRead, UnicodeDecodeError):
        return ""
    return f": {text[:300]}" if text else ""


def error_from_response(
    resp: Response, target: str, offset: str | None = None
) -> DurableStreamsError:
    """Map an error status (with its protocol headers) to the matching typed error."""
    status = resp.status_code
    said = _said(resp)
    if status == 400:
        return StreamBadRequestError(
            f"the server rejected the request for {target} as invalid{said}; fix the request",
            status=status,
        )
    if status == 403 and "producer-epoch" in resp.headers:
        epoch = header_int(resp, "producer-epoch")
        return StaleEpochError(
            f"append to {target} rejected: producer epoch is stale (the server is at epoch "
            f"{epoch}); a newer producer owns this id, stop or restart with a higher epoch",
            current_epoch=epoch,
        )
    if status in (401, 403):
        return StreamUnauthorizedError(
            f"the server denied access to {target} (HTTP {status}){said}; check the "
            "credentials (options bearerToken, secretHeaders; DurableConfig.headers)",
            status=status,
        )
    if status == 404:
        return StreamNotFoundError(
            f"{target} was not found{said}; create it first or check the URL", status=status
        )
    if status == 409:
        return _conflict(resp, target, said)
    if status == 410:
        return OffsetGoneError(
            f"data of {target} at offset {offset!r} is gone (retention or deletion): records "
            "were lost to this reader; restart from offset '-1' or 'now'",
            offset=offset,
        )
    if status == 429:
        return StreamRateLimitedError(
            f"the server rate-limited the request for {target}; slow down and retry",
            status=status,
        )
    if status == 408 or status >= 500:
        return StreamUnavailableError(
            f"the server could not serve {target} right now (HTTP {status}){said}; retry later",
            status=status,
        )
    return DurableStreamsError(
        f"the server answered HTTP {status} for {target}{said}", status=status
    )


def _conflict(resp: Response, target: str, said: str) -> DurableStreamsError:
    """A 409: the stream is closed, a producer's batch went missing, or another conflict."""
    if resp.headers.get("stream-closed", "").lower() == "true":
        return StreamClosedError(
            f"{target} is closed; nothing more can be appended",
            final_offset=resp.headers.get("stream-next-offset"),
        )
    if "producer-expected-seq" in resp.headers:
        expected = header_int(resp, "producer-expected-seq")
        received = header_int(resp, "producer-received-seq")
        return SequenceGapError(
            f"append to {target} rejected: producer sequence gap (expected {expected}, got "
            f"{received}); an earlier batch of this producer was lost, restart the producer "
            "with a new epoch",
            expected_seq=expected,
            received_seq=received,
        )
    return StreamConflictError(
        f"the request conflicts with {target} (another configuration, content type, or a "
        f"Stream-Seq regression){said}",
        status=409,
    )


def error_from_transport(
    exc: httpx.TransportError,
    target: str,
    what: str,
    exchange: Exchange | None = None,
    *,
    streamed: bool = False,
) -> ServiceError:
    """An httpx transport failure (connect, timeout, reset, truncated body): retryable
    `StreamUnavailableError` (with `unsent` / `stale_connection`), or `TlsError`."""
    err = transport_error(exc, exchange, target, what, StreamUnavailableError,
                          streamed=streamed)
    err.__cause__ = exc
    return err


def error_from_decoding(exc: BodyDecodingError, target: str) -> MalformedResponseError:
    """An answer whose body does not decode by its Content-Encoding, or is longer than the
    call holds: not retried (a server that sent it once sends it again)."""
    if isinstance(exc, BodyTooLargeError):
        err = MalformedResponseError(
            f"the answer for {target} is over {exc.limit} bytes, the most held of one answer "
            "(DurableConfig.max_read_bytes): raise it to hold more, or read with read(), "
            "which takes answers of any length as they arrive; not retried",
            code="response_too_large",
        )
        err.__cause__ = exc
        return err
    err = MalformedResponseError(
        f"the answer for {target} could not be read: {exc}. The server or a proxy on the "
        "way sent a broken compressed body; if it persists, ask for uncompressed answers "
        "(DurableConfig(compression=False))",
        code="response_compression",
    )
    err.__cause__ = exc
    return err
