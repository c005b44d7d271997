"""Retry policy and the retry loop shared by the S2 and Durable Streams clients.

Protocol-neutral: an operation is retried when it failed with a `ServiceError` whose
`retryable` flag is set, with exponential backoff and jitter, until `RetryPolicy.timeout`
seconds have passed since its first failure without progress; an error that names the
pause the service asked for (`ServiceError.retry_after`, S2's `retry-after-ms`) waits at
least that long, or ends the retries when that would pass the deadline. Whatever an attempt
delivers (records read, an append acknowledged) is progress and resets that budget, so a
long read on a flaky network goes on as long as it keeps moving. A dead pooled connection
(closed by a server or proxy while idle) is retried at once on another one and costs
nothing. Resumable reads run one attempt at a time through `run_attempts`.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Literal, Self, TypeVar

from s2_spark._closeable import Closeable
from s2_spark.errors import ServiceError

__all__ = [
    "DEFAULT_RETRY_TIMEOUT",
    "AttemptOutcome",
    "ResumableRead",
    "RetryLoop",
    "RetryPolicy",
    "run_attempts",
]

log = logging.getLogger("s2_spark.retry")

T = TypeVar("T")

# What one attempt of a resumable operation ended with: finished, reconnect at once
# (without backoff or counting a failure), or failed with an error to retry or raise.
AttemptOutcome = Literal["done", "reconnect"] | ServiceError

DEFAULT_RETRY_TIMEOUT = 120.0
"""Seconds of retrying without progress before giving up (Kafka's delivery.timeout.ms)."""

def _stale_retries() -> int:
    """Dead pooled connections one operation may meet in a row: every idle one can be
    dead. (Asked only after a failure: importing the HTTP seam is for callers that talk
    to a server, not for every module that names a retry policy.)"""
    from s2_spark._http import POOL_LIMITS

    return POOL_LIMITS.max_keepalive + 1


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry transient failures until `timeout` seconds pass without progress.

    Retry n waits min(initial_backoff * multiplier**n, max_backoff) plus up to 50% jitter.
    `timeout` counts from the first failure since the operation last made progress; 0
    turns retries off. `max_attempts`, when set, also stops after that many consecutive
    failed attempts (1 turns retries off). `initial_backoff` must be > 0 (a zero backoff
    would hammer a struggling server).
    """

    max_attempts: int | None = None
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0
    timeout: float = DEFAULT_RETRY_TIMEOUT

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise ValueError(
                f"RetryPolicy.max_attempts must be None or an int >= 1 (got {self.max_attempts!r})"
            )
        if not self.initial_backoff > 0 or not math.isfinite(self.initial_backoff):
            raise ValueError(
                f"RetryPolicy.initial_backoff must be a finite number of seconds > 0 "
                f"(got {self.initial_backoff!r})"
            )
        if not self.max_backoff >= self.initial_backoff or not math.isfinite(self.max_backoff):
            raise ValueError(
                f"RetryPolicy.max_backoff must be finite and >= initial_backoff "
                f"(got {self.max_backoff!r})"
            )
        if not self.multiplier >= 1 or not math.isfinite(self.multiplier):
            raise ValueError(
                f"RetryPolicy.multiplier must be a finite number >= 1 (got {self.multiplier!r})"
            )
        if (isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float)
                or not 0 <= self.timeout < math.inf):
            raise ValueError(
                f"RetryPolicy.timeout must be a finite number of seconds >= 0 "
                f"(got {self.timeout!r})"
            )

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (0 = first retry)."""
        try:
            growth = self.multiplier ** min(attempt, 60)
        except OverflowError:
            growth = math.inf
        base = min(self.initial_backoff * growth, self.max_backoff)
        return base * (1.0 + random.random() * 0.5)


class RetryLoop:
    """Tracks one operation's failures since its last progress and waits out the backoff."""

    def __init__(
        self,
        policy: RetryPolicy,
        what: str,
        on_retry: Callable[[ServiceError, float], None] | None = None,
    ) -> None:
        self.policy = policy
        self.what = what
        self.failures = 0
        self._since: float | None = None  # first failure since the last progress
        self._stale = 0
        self._on_retry = on_retry

    def progressed(self) -> None:
        """The operation delivered something: the retry budget starts over."""
        self.failures = 0
        self._since = None
        self._stale = 0

    def failed(self, err: ServiceError) -> None:
        """Raise `err` if it may not be retried or the budget is spent; else back off."""
        if not err.retryable:
            raise err
        if err.stale_connection and self._stale < _stale_retries():
            self._stale += 1
            log.debug("%s met a dead pooled connection; retrying at once", self.what)
            if self._on_retry is not None:
                self._on_retry(err, 0.0)
            return
        now = time.monotonic()
        if self._since is None:
            self._since = now
        self.failures += 1
        elapsed = now - self._since
        policy = self.policy
        if elapsed >= policy.timeout or (
            policy.max_attempts is not None and self.failures >= policy.max_attempts
        ):
            raise self._gave_up(err, elapsed)
        asked = err.retry_after
        if asked is not None and elapsed + asked > policy.timeout:
            # Retrying sooner than the service asked is no use, and later is past the
            # deadline: give up now.
            err.attempts, err.retried_for = self.failures, elapsed
            err.amend(f"; not retried: the service asked to wait {asked:g}s before "
                      f"retrying (retry-after-ms), beyond the retry timeout "
                      f"({policy.timeout:g}s, {elapsed:.1f}s of it spent): raise option "
                      "retryTimeoutMs or RetryPolicy.timeout to wait longer")
            raise err
        delay = min(policy.backoff(self.failures - 1), policy.timeout - elapsed)
        if asked is not None:
            delay = max(delay, asked)  # at least what the service asked for (S2's SDK)
        log.debug("%s retrying after %s in %.3fs", self.what, type(err).__name__, delay)
        if self._on_retry is not None:
            self._on_retry(err, delay)
        time.sleep(delay)

    def _gave_up(self, err: ServiceError, elapsed: float) -> ServiceError:
        """`err`, saying what was retried and for how long."""
        err.attempts, err.retried_for = self.failures, elapsed
        policy = self.policy
        if policy.timeout == 0 or policy.max_attempts == 1:
            err.amend("; not retried: retries are off (option retryTimeoutMs=0, or a "
                      "RetryPolicy with timeout=0)")
        elif policy.max_attempts is not None and self.failures >= policy.max_attempts:
            err.amend(f"; gave up after {self.failures} attempts in {elapsed:.1f}s "
                      f"(RetryPolicy.max_attempts={policy.max_attempts})")
        else:
            err.amend(f"; gave up after {self.failures} attempts in {elapsed:.1f}s without "
                      f"progress (the retry timeout is {policy.timeout:g}s: raise option "
                      "retryTimeoutMs or RetryPolicy.timeout to wait longer)")
        return err


def run_attempts(
    attempt: Callable[[RetryLoop], Generator[T, None, AttemptOutcome]],
    loop: RetryLoop,
) -> Generator[T, None, None]:
    """Run `attempt` until it reports "done", retrying failures per the loop's policy.

    Each attempt yields what it delivers and resumes where the previous one stopped (the
    attempt owns its progress); errors an attempt raises instead of returning propagate.
    """
    while True:
        outcome = yield from attempt(loop)
        if outcome == "done":
            return
        if outcome == "reconnect":
            continue
        assert isinstance(outcome, ServiceError)
        loop.failed(outcome)


class ResumableRead(Closeable, Iterator[T]):
    """Base of read iterators driven by `run_attempts`: subclasses set `self._gen`.

    Use one as a context manager, or call `close()`, to end its HTTP response early.
    """

    _gen: Generator[T, None, None]

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        return next(self._gen)

    def close(self) -> None:
        """End the read and close its HTTP response."""
        self._gen.close()

    def __del__(self) -> None:
        gen = getattr(self, "_gen", None)
        if gen is not None:
            gen.close()
