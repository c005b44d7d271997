"""Retry policy and the retry loop shared by the S2 and Durable Streams clients.

Protocol-neutral: an operation is retried when it failed with a `ServiceError` whose
`retryable` flag is set, up to `RetryPolicy.max_attempts` consecutive failures, sleeping
an exponential backoff with jitter between attempts. Resumable reads run one attempt at a
time through `run_attempts`; whatever an attempt delivered resets the failure count.
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

__all__ = ["AttemptOutcome", "ResumableRead", "RetryLoop", "RetryPolicy", "run_attempts"]

log = logging.getLogger("s2_spark.retry")

T = TypeVar("T")

# What one attempt of a resumable operation ended with: finished, reconnect at once
# (without backoff or counting a failure), or failed with an error to retry or raise.
AttemptOutcome = Literal["done", "reconnect"] | ServiceError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: retry n waits min(initial * multiplier**n, max) plus
    up to 50%.

    `max_attempts` counts every attempt including the first, so 1 disables retries.
    `initial_backoff` must be > 0 (a zero backoff would hammer a struggling server).
    """

    max_attempts: int = 5
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(
                f"RetryPolicy.max_attempts must be an int >= 1 (got {self.max_attempts!r})"
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

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (0 = first retry)."""
        try:
            growth = self.multiplier ** min(attempt, 60)
        except OverflowError:
            growth = math.inf
        base = min(self.initial_backoff * growth, self.max_backoff)
        return base * (1.0 + random.random() * 0.5)


class RetryLoop:
    """Counts consecutive failures of one operation and waits out the backoff between them."""

    def __init__(
        self,
        policy: RetryPolicy,
        what: str,
        on_retry: Callable[[ServiceError, float], None] | None = None,
    ) -> None:
        self.policy = policy
        self.what = what
        self.failures = 0
        self._on_retry = on_retry

    def progressed(self) -> None:
        """The operation delivered something: the next failure is a first failure again."""
        self.failures = 0

    def failed(self, err: ServiceError) -> None:
        """Raise `err` if it may not be retried or attempts are used up; else back off."""
        self.failures += 1
        if not err.retryable or self.failures >= self.policy.max_attempts:
            raise err
        delay = self.policy.backoff(self.failures - 1)
        log.debug("%s retrying after %s in %.3fs", self.what, type(err).__name__, delay)
        if self._on_retry is not None:
            self._on_retry(err, delay)
        time.sleep(delay)


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
