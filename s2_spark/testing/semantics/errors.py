"""The local server's error responses: an HTTP status and the JSON body S2 sends."""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError"]


class ApiError(Exception):
    """An error response. `body` is sent as JSON; standard errors carry `code` and `message`."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body

    @classmethod
    def standard(cls, status: int, code: str, message: str) -> ApiError:
        return cls(status, {"code": code, "message": message})

    @classmethod
    def invalid(cls, message: str) -> ApiError:
        """422 `invalid`: well-formed input that breaks a rule (limits, names, bounds)."""
        return cls.standard(422, "invalid", message)

    @classmethod
    def bad(cls, code: str, message: str) -> ApiError:
        """400 with a `bad_*` code: input that could not be parsed."""
        return cls.standard(400, code, message)

    @classmethod
    def unwritten(cls, seq_num: int, timestamp: int) -> ApiError:
        """416: a read would start past the tail; the body carries the tail."""
        return cls(416, {"tail": {"seq_num": seq_num, "timestamp": timestamp}})
