"""One exception hierarchy for every layer of s2-spark.

Codecs raise `FrameError`; protocol clients raise `ServiceError` subclasses (the `S2Error`
family for S2, the `DurableStreamsError` family for Durable Streams), each carrying the
HTTP status and the service's error code when there was one. Messages say what happened
and what to do. No message, repr or attribute ever holds an access token.
"""

from __future__ import annotations

from dataclasses import dataclass


class S2SparkError(Exception):
    """Root of every error raised by s2-spark."""


class OptionError(S2SparkError, ValueError):
    """A data source option is missing, conflicting or has a value that is not accepted."""


class FrameError(S2SparkError):
    """Malformed S2S session data: bad length, flags, compression or terminal body."""


@dataclass(frozen=True, slots=True)
class Position:
    """A stream position: the next sequence number and the timestamp (ms) at it."""

    seq_num: int
    timestamp: int


class ServiceError(S2SparkError):
    """A call to a service (S2 or Durable Streams) failed.

    `status` is the HTTP status (0 when none was received), `code` the service's error code
    when it sent one; `retryable` says whether repeating the call may succeed. For failures
    in transit, `unsent` says the request provably never reached the server whole (so it
    had no effect) and `stale_connection` that a pooled connection was found dead (closed
    while idle), which says nothing about the service. `attempts` and `retried_for`
    (seconds) tell how long the call was retried before this error was raised.
    """

    retryable: bool = False

    def __init__(self, message: str, *, status: int = 0, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.unsent = False
        self.stale_connection = False
        self.attempts = 1
        self.retried_for = 0.0

    def amend(self, note: str) -> None:
        """Add `note` to the message (it must never hold a credential)."""
        self.message = f"{self.message}{note}"
        self.args = (self.message,)


class S2Error(ServiceError):
    """An S2 operation failed. `status` is the HTTP status (0 when none was received)."""


class BadRequestError(S2Error):
    """The request was invalid (HTTP 400/422, or rejected before it was sent)."""


class UnauthorizedError(S2Error):
    """The access token is missing, invalid, or lacks permission (HTTP 401/403)."""


class NotFoundError(S2Error):
    """The basin or stream does not exist (HTTP 404)."""


class AlreadyExistsError(S2Error):
    """The basin or stream already exists (HTTP 409)."""


class ConditionFailedError(S2Error):
    """An append precondition failed (HTTP 412)."""


class SeqNumMismatchError(ConditionFailedError):
    """`match_seq_num` did not equal the stream's tail; `expected_seq_num` is the tail."""

    def __init__(self, message: str, *, expected_seq_num: int, status: int = 412) -> None:
        super().__init__(message, status=status, code="seq_num_mismatch")
        self.expected_seq_num = expected_seq_num


class FencingTokenMismatchError(ConditionFailedError):
    """The stream is fenced with another token; `expected_token` is the current one."""

    def __init__(self, message: str, *, expected_token: str, status: int = 412) -> None:
        super().__init__(message, status=status, code="fencing_token_mismatch")
        self.expected_token = expected_token


class ReadPastTailError(S2Error):
    """A read started beyond the tail (HTTP 416); `tail` is the stream's tail."""

    def __init__(self, message: str, *, tail: Position, status: int = 416) -> None:
        super().__init__(message, status=status, code="range_not_satisfiable")
        self.tail = tail


class RecordTooLargeError(BadRequestError):
    """One record exceeds S2's 1 MiB metered limit; it can never be appended."""

    def __init__(self, message: str, *, metered_bytes: int, limit: int) -> None:
        super().__init__(message, status=0, code="record_too_large")
        self.metered_bytes = metered_bytes
        self.limit = limit


class TlsError(ServiceError):
    """TLS with the service failed in a way retrying cannot fix: its certificate is not
    trusted (a private CA: set the CA bundle option), or it refused ours."""


class RateLimitedError(S2Error):
    """The service is throttling requests (HTTP 429); retried with backoff."""

    retryable = True


class UnavailableError(S2Error):
    """The service or network failed transiently (5xx, 408, timeouts, resets)."""

    retryable = True


class SessionTimeoutError(UnavailableError):
    """A read session went silent (no data or heartbeat) for longer than allowed."""


class DataLossError(S2SparkError):
    """Records in a planned range are gone (trimmed by retention or stream deleted)."""

    def __init__(self, message: str, *, stream: str, start: object, end: object) -> None:
        super().__init__(message)
        self.stream = stream
        self.start = start
        self.end = end


class WriterFencedError(S2SparkError):
    """A newer attempt of the same write (task retry or restarted query) owns the stream.

    Raised by the exactly-once sink so a stale attempt stops instead of appending twice.
    """

    def __init__(self, message: str, *, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


class DurableStreamsError(ServiceError):
    """A Durable Streams operation failed. `status` is the HTTP status (0: none received)."""


class StreamBadRequestError(DurableStreamsError):
    """The server rejected the request as invalid (HTTP 400, or checked before sending)."""


class StreamNotFoundError(DurableStreamsError):
    """The stream does not exist (HTTP 404)."""


class StreamConflictError(DurableStreamsError):
    """The request conflicts with the stream (HTTP 409): another configuration on create,
    another content type, or a `Stream-Seq` regression on append."""


class StreamClosedError(StreamConflictError):
    """The stream is closed: nothing more can be appended. `final_offset` is its tail."""

    def __init__(self, message: str, *, final_offset: str | None, status: int = 409) -> None:
        super().__init__(message, status=status, code="stream_closed")
        self.final_offset = final_offset


class StaleEpochError(DurableStreamsError):
    """A newer producer epoch owns the stream (HTTP 403); this producer is fenced out."""

    def __init__(self, message: str, *, current_epoch: int | None, status: int = 403) -> None:
        super().__init__(message, status=status, code="stale_epoch")
        self.current_epoch = current_epoch


class SequenceGapError(DurableStreamsError):
    """A producer sequence number skipped ahead (HTTP 409): earlier batches are missing."""

    def __init__(
        self, message: str, *, expected_seq: int | None, received_seq: int | None
    ) -> None:
        super().__init__(message, status=409, code="sequence_gap")
        self.expected_seq = expected_seq
        self.received_seq = received_seq


class OffsetGoneError(DurableStreamsError):
    """Data at `offset` is gone (HTTP 410: retention or soft delete): data loss, not retried."""

    def __init__(self, message: str, *, offset: str | None, status: int = 410) -> None:
        super().__init__(message, status=status, code="gone")
        self.offset = offset


class StreamRateLimitedError(DurableStreamsError):
    """The server is throttling requests (HTTP 429); retried with backoff."""

    retryable = True


class StreamUnavailableError(DurableStreamsError):
    """The server or network failed transiently (5xx, timeouts, resets); retried."""

    retryable = True


class MalformedResponseError(DurableStreamsError):
    """The server's answer broke the protocol (missing or bad header, invalid JSON, SSE or
    base64); not retried, since asking again would most likely get the same answer."""
