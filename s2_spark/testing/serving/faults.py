"""Test-only fault injection: the local server answers a chosen S2 error to the next N
requests of a kind. Not part of S2's API, and never used unless a test arms it.

Tests use it to see what a client does with each of S2's answers on a real request
path (retried or not, outcome unknown or not, how long it waited): `arm` says which
kind of request (the names the request counts use: `append`, `append_session`, `read`,
`read_session`, `read_wait`, `check_tail`, `create_stream`, ...), optionally in which
basin and stream, and what to answer: a status with S2's error body (`code`, `message`),
optionally a `retry-after-ms` header; for S2S sessions (`terminal`) a 200 whose body is
one terminal frame, as S2 ends a session that has started. With `landed`, the request
takes effect first and the error replaces its answer: what a client sees when an
append lands and its answer is lost (a 503 `unavailable` says nothing about that).
Armed in process (`LocalS2Server.inject_fault`) or over the testing-only path
`POST /_local/faults` (`ServerProcess.inject_fault`).
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from s2_spark.testing.serving.asgi import Send, respond, respond_json
from s2_spark.wire.frames import encode_terminal

__all__ = ["FAULTS_PATH", "Fault", "Faults", "answer_fault", "swallowed"]

#: The testing-only path that arms a fault (JSON: the arguments of `Faults.arm`).
FAULTS_PATH = "/_local/faults"


@dataclass(eq=False)
class Fault:
    """One armed error; `fired` holds when (monotonic seconds) it answered, in order."""

    kind: str
    status: int
    body: dict[str, Any]
    times: int
    basin: str | None = None
    stream: str | None = None
    retry_after_ms: int | None = None
    landed: bool = False
    terminal: bool = False
    fired: list[float] = field(default_factory=list)

    def matches(self, kind: str, basin: str | None, stream: str | None) -> bool:
        return (len(self.fired) < self.times and kind == self.kind
                and self.basin in (None, basin) and self.stream in (None, stream))

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after_ms is None:
            return []
        return [(b"retry-after-ms", str(self.retry_after_ms).encode())]


class Faults:
    """The faults armed on one server, answered first come first served."""

    def __init__(self) -> None:
        self._armed: list[Fault] = []

    def arm(self, kind: str, status: int, code: str, message: str = "injected by a test",
            *, times: int = 1, basin: str | None = None, stream: str | None = None,
            retry_after_ms: int | None = None, landed: bool = False,
            terminal: bool = False) -> Fault:
        """Answer the next `times` requests of `kind` (in `basin`, to `stream`, when
        given) with `status` and S2's error body; see the module's docstring."""
        if times < 1:
            raise ValueError(f"times must be >= 1 (got {times})")
        if terminal and not kind.endswith("_session"):
            raise ValueError("terminal frames answer S2S sessions only (kind *_session)")
        if landed and (terminal or kind.endswith("_session")):
            raise ValueError("landed applies to unary requests only")
        fault = Fault(kind, status, {"code": code, "message": message}, times, basin, stream,
                      retry_after_ms, landed, terminal)
        self._armed.append(fault)
        return fault

    def arm_json(self, spec: dict[str, Any]) -> Fault:
        """`arm` from the JSON a test posts to `FAULTS_PATH`."""
        return self.arm(**spec)

    def take(self, kind: str, basin: str | None, stream: str | None) -> Fault | None:
        """The fault that answers this request, if one is armed for it (counted as fired)."""
        for fault in self._armed:
            if fault.matches(kind, basin, stream):
                fault.fired.append(time.monotonic())
                if len(fault.fired) >= fault.times:
                    self._armed.remove(fault)
                return fault
        return None


async def answer_fault(fault: Fault, send: Send) -> None:
    """Send the fault's answer: its status and body, or a session's terminal frame."""
    if not fault.terminal:
        await respond_json(send, fault.status, fault.body, fault.headers())
        return
    await respond(send, 200, encode_terminal(fault.status, fault.body),
                  [(b"content-type", b"s2s/proto"), *fault.headers()])


async def swallowed(message: MutableMapping[str, Any]) -> None:
    """A `send` that drops a handler's answer (a `landed` fault's replaces it)."""
    return None
