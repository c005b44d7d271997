"""One exception hierarchy for every layer of s2-spark, one vocabulary for both services.

Codecs raise `FrameError`; protocol clients raise `ServiceError` subclasses, each carrying
the HTTP status and the service's error code when there was one. What went wrong has one
service-neutral class (`NotFoundError`, `UnavailableError`, ...); each service's own class
derives from it and from the service's root (`S2Error`, `DurableStreamsError`), so
`except NotFoundError` catches a missing S2 stream and a missing Durable Stream alike, and
`except S2Error` every failure of S2. The backend interface (`s2_spark.backends.base`)
promises only the neutral classes. Messages say what happened and what to do. No message,
repr or attribute ever holds an access token or an encryption key.

The tree (a service's class is drawn under its neutral base; those marked S2 also derive
from `S2Error`, those marked DS from `DurableStreamsError`):

```text
S2SparkError
├── OptionError                     a data source option is not accepted (a ValueError)
├── FrameError                      malformed S2S session data
├── WriterFencedError               a sink's newer attempt owns the stream: this one stops
├── ReplayMismatchError             a replayed micro-batch's rows are not the rows it wrote
└── ServiceError                    a call to S2 or Durable Streams failed
    ├── BadRequestError             400/422, or refused before sending
    │   ├── S2BadRequestError                      S2
    │   │   ├── RecordTooLargeError                S2
    │   │   └── EncryptionKeyError                 S2
    │   └── StreamBadRequestError                  DS
    ├── UnauthorizedError           401/403: credentials missing, wrong or not enough
    │   ├── S2UnauthorizedError                    S2
    │   └── StreamUnauthorizedError                DS
    ├── NotFoundError               404: no such basin or stream (or one being deleted)
    │   ├── S2NotFoundError                        S2
    │   │   └── DeletionPendingError   (409)       S2
    │   └── StreamNotFoundError                    DS
    ├── ConflictError               409: the resource exists, or is in another state
    │   ├── AlreadyExistsError                     S2
    │   └── StreamConflictError                    DS
    │       └── StreamClosedError                  DS
    ├── FencedError                 another writer owns the stream
    │   ├── FencingTokenMismatchError  (412)       S2, also a ConditionFailedError
    │   └── StaleEpochError            (403)       DS
    ├── DataLossError               records to be read are gone (retention, deletion)
    │   └── OffsetGoneError            (410)       DS
    ├── RateLimitedError            429; retried with backoff
    │   ├── S2RateLimitedError                     S2
    │   └── StreamRateLimitedError                 DS
    ├── UnavailableError            5xx, 408, failures in transit; retried with backoff
    │   ├── S2UnavailableError                     S2
    │   │   └── SessionTimeoutError                S2
    │   └── StreamUnavailableError                 DS
    ├── TlsError                    TLS failed in a way retrying cannot fix
    ├── S2Error                     every S2 failure: the S2 classes above, and
    │   ├── ConditionFailedError    412: an append precondition failed
    │   │   ├── SeqNumMismatchError
    │   │   └── FencingTokenMismatchError
    │   └── ReadPastTailError       416
    └── DurableStreamsError         every Durable Streams failure: the DS classes above, and
        ├── SequenceGapError        409: a producer's earlier batch is missing
        └── MalformedResponseError  the answer broke the protocol
```

`NotFoundError`, `BadRequestError`, `UnauthorizedError`, `RateLimitedError` and
`UnavailableError` were S2's own classes before; S2's classes now derive from them, so
code that catches them catches what it did.
"""

from __future__ import annotations

from dataclasses import dataclass


class S2SparkError(Exception):
    """Root of every error raised by s2-spark."""


class OptionError(S2SparkError, ValueError):
    """A data source option is missing, conflicting or has a value that is not accepted."""


class FrameError(S2SparkError):
    """Malformed S2S session data: bad length, flags, compression or terminal body."""


class WriterFencedError(S2SparkError):
    """A newer attempt of the same write (task retry or restarted query) owns the stream.

    Raised by the exactly-once sinks so a stale attempt stops instead of appending twice.
    """

    def __init__(self, message: str, *, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


class ReplayMismatchError(S2SparkError):
    """A replayed micro-batch's rows for a stream are not the rows an earlier attempt of
    its partition wrote there: exactly-once cannot hold, and the writer stops.

    Raised by the `s2` sink, which finds what an earlier attempt landed by content (any
    order), so a replay must give each partition the same rows, in any order."""

    def __init__(self, message: str, *, stream: str) -> None:
        super().__init__(message)
        self.stream = stream


@dataclass(frozen=True, slots=True)
class Position:
    """A stream position: the next sequence number and the timestamp (ms) at it."""

    seq_num: int
    timestamp: int


class ServiceError(S2SparkError):
    """A call to a service (S2 or Durable Streams) failed.

    `status` is the HTTP status (0 when none was received), `code` the service's error code
    when it sent one; `retryable` says whether repeating the call may succeed (for S2, from
    the table of its error codes, `s2_spark.s2._error_codes`). `unsent` says the request
    provably had no effect: it never reached the server whole (a failure in transit), or
    the service answered with an error it guarantees has no side effect (S2's 429
    `rate_limited`, 503 `server_draining`, ...); only such a failure of an append without
    a condition is retried. `stale_connection` says a pooled connection was found dead
    (closed while idle), which says nothing about the service. `retry_after` (seconds, or
    None) is the pause the service asked for before a retry. `attempts` and `retried_for`
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
        self.retry_after: float | None = None
        self.attempts = 1
        self.retried_for = 0.0

    def amend(self, note: str) -> None:
        """Add `note` to the message (it must never hold a credential)."""
        self.message = f"{self.message}{note}"
        self.args = (self.message,)


class TlsError(ServiceError):
    """TLS with the service failed in a way retrying cannot fix: its certificate is not
    trusted (a private CA: set the CA bundle option), or it refused ours."""


# -- what went wrong, whichever service it was --------------------------------------------


class BadRequestError(ServiceError):
    """The request was invalid (HTTP 400/422, or rejected before it was sent)."""


class UnauthorizedError(ServiceError):
    """The credentials are missing, invalid, or lack permission (HTTP 401/403)."""


class NotFoundError(ServiceError):
    """The basin or stream does not exist (HTTP 404), or is being deleted
    (`deletion_pending`): gone for reads and appends either way."""

    deletion_pending: bool = False


class ConflictError(ServiceError):
    """The request conflicts with the resource (HTTP 409): it exists already, with another
    configuration, or is closed."""


class FencedError(ServiceError):
    """Another writer owns the stream (S2's fencing token, Durable Streams' producer epoch
    moved on); not retried: stop writing, or take the stream over."""


class DataLossError(ServiceError):
    """Records to be read are gone (trimmed by retention, or the stream was deleted).

    The Spark reader raises it for a planned range it cannot read, naming `stream`,
    `start` and `end`; a client raises its service's subclass (they are None there).
    """

    def __init__(
        self,
        message: str,
        *,
        stream: str | None = None,
        start: object = None,
        end: object = None,
        status: int = 0,
        code: str | None = None,
    ) -> None:
        super().__init__(message, status=status, code=code)
        self.stream = stream
        self.start = start
        self.end = end


class RateLimitedError(ServiceError):
    """The service is throttling requests (HTTP 429); retried with backoff."""

    retryable = True


class UnavailableError(ServiceError):
    """The service or network failed transiently (5xx, 408, timeouts, resets); retried."""

    retryable = True


# -- S2 -----------------------------------------------------------------------------------


class S2Error(ServiceError):
    """An S2 operation failed. `status` is the HTTP status (0 when none was received)."""


class S2BadRequestError(S2Error, BadRequestError):
    """S2 rejected the request as invalid (HTTP 400/422), or the client did before sending."""


class S2UnauthorizedError(S2Error, UnauthorizedError):
    """The access token is missing, invalid, or lacks permission (HTTP 401/403)."""


class S2NotFoundError(S2Error, NotFoundError):
    """The basin or stream does not exist (HTTP 404)."""


class DeletionPendingError(S2NotFoundError):
    """The basin or stream is being deleted (HTTP 409 `stream_deletion_pending` or
    `basin_deletion_pending`): it can no longer be read, appended to, reconfigured or
    created again until S2 has removed it, shortly after (then it is not found, 404).
    A `NotFoundError`: whoever reads or writes it finds it gone."""

    deletion_pending = True


class AlreadyExistsError(S2Error, ConflictError):
    """The basin or stream already exists (HTTP 409)."""


class ConditionFailedError(S2Error):
    """An append precondition failed (HTTP 412)."""


class SeqNumMismatchError(ConditionFailedError):
    """`match_seq_num` did not equal the stream's tail; `expected_seq_num` is the tail."""

    def __init__(self, message: str, *, expected_seq_num: int, status: int = 412) -> None:
        super().__init__(message, status=status, code="seq_num_mismatch")
        self.expected_seq_num = expected_seq_num


class FencingTokenMismatchError(ConditionFailedError, FencedError):
    """The stream is fenced with another token; `expected_token` is the current one."""

    def __init__(self, message: str, *, expected_token: str, status: int = 412) -> None:
        super().__init__(message, status=status, code="fencing_token_mismatch")
        self.expected_token = expected_token


class ReadPastTailError(S2Error):
    """A read started beyond the tail (HTTP 416); `tail` is the stream's tail."""

    def __init__(self, message: str, *, tail: Position, status: int = 416) -> None:
        super().__init__(message, status=status, code="range_not_satisfiable")
        self.tail = tail


class RecordTooLargeError(S2BadRequestError):
    """One record exceeds S2's 1 MiB metered limit; it can never be appended."""

    def __init__(self, message: str, *, metered_bytes: int, limit: int) -> None:
        super().__init__(message, status=0, code="record_too_large")
        self.metered_bytes = metered_bytes
        self.limit = limit


class EncryptionKeyError(S2BadRequestError):
    """An encrypted stream's key is missing or refused (400 `bad_header`), or its records
    do not decrypt with the key given (400 `decryption_failed`: the key is wrong)."""


class S2RateLimitedError(S2Error, RateLimitedError):
    """S2 is throttling requests (HTTP 429); retried with backoff."""


class S2UnavailableError(S2Error, UnavailableError):
    """S2 or the network failed transiently (5xx, 408, timeouts, resets); retried."""


class SessionTimeoutError(S2UnavailableError):
    """A read session went silent (no data or heartbeat) for longer than allowed."""


# -- Durable Streams ----------------------------------------------------------------------


class DurableStreamsError(ServiceError):
    """A Durable Streams operation failed. `status` is the HTTP status (0: none received)."""


class StreamBadRequestError(DurableStreamsError, BadRequestError):
    """The server rejected the request as invalid (HTTP 400, or checked before sending)."""


class StreamUnauthorizedError(DurableStreamsError, UnauthorizedError):
    """The server denied access (HTTP 401, or 403 without a producer epoch): the
    credentials (bearer token, secret headers) are missing, wrong or not enough."""


class StreamNotFoundError(DurableStreamsError, NotFoundError):
    """The stream does not exist (HTTP 404)."""


class StreamConflictError(DurableStreamsError, ConflictError):
    """The request conflicts with the stream (HTTP 409): another configuration on create,
    another content type, or a `Stream-Seq` regression on append."""


class StreamClosedError(StreamConflictError):
    """The stream is closed: nothing more can be appended. `final_offset` is its tail."""

    def __init__(self, message: str, *, final_offset: str | None, status: int = 409) -> None:
        super().__init__(message, status=status, code="stream_closed")
        self.final_offset = final_offset


class StaleEpochError(DurableStreamsError, FencedError):
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


class OffsetGoneError(DurableStreamsError, DataLossError):
    """Data at `offset` is gone (HTTP 410: retention or soft delete): data loss, not retried."""

    def __init__(self, message: str, *, offset: str | None, status: int = 410) -> None:
        super().__init__(message, status=status, code="gone")
        self.offset = offset


class StreamRateLimitedError(DurableStreamsError, RateLimitedError):
    """The server is throttling requests (HTTP 429); retried with backoff."""


class StreamUnavailableError(DurableStreamsError, UnavailableError):
    """The server or network failed transiently (5xx, timeouts, resets); retried."""


class MalformedResponseError(DurableStreamsError):
    """The server's answer broke the protocol (missing or bad header, invalid JSON, SSE or
    base64); not retried, since asking again would most likely get the same answer."""
