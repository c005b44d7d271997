"""The local server's error responses: an HTTP status and the JSON body S2 sends.

Every `code` is one of S2's (`api/src/v1/error.rs`, `ErrorCode`) with the status S2
gives it (`ErrorCode::status`); `CODE_STATUS` lists them, and `standard` refuses any
other pairing. A few answers come from s2-lite's HTTP stack rather than its handlers and
have an empty body (`empty`): unknown routes (404), a wrong method (405), a
Content-Encoding it cannot undo (415).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CODE_STATUS", "ApiError"]

#: S2's error codes and their HTTP statuses (`api/src/v1/error.rs`, `ErrorCode::status`).
CODE_STATUS: dict[str, int] = {
    "access_token_not_found": 404,
    "authn": 401,
    "bad_frame": 400,
    "bad_header": 400,
    "bad_json": 400,
    "bad_path": 400,
    "bad_proto": 400,
    "bad_query": 400,
    "basin_deletion_pending": 409,
    "basin_not_found": 404,
    "client_hangup": 499,
    "decryption_failed": 400,
    "hot_server": 502,
    "invalid": 422,
    "not_implemented": 501,
    "other": 500,
    "permission_denied": 403,
    "quota_exhausted": 403,
    "rate_limited": 429,
    "request_timeout": 408,
    "resource_already_exists": 409,
    "server_draining": 503,
    "storage": 500,
    "stream_deletion_pending": 409,
    "stream_not_found": 404,
    "transaction_conflict": 409,
    "unavailable": 503,
    "upstream_timeout": 504,
}


class ApiError(Exception):
    """An error response. `body` is sent as JSON; standard errors carry `code` and `message`."""

    def __init__(self, status: int, body: dict[str, Any], *, empty: bool = False) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body
        self.empty_body = empty

    @classmethod
    def standard(cls, status: int, code: str, message: str) -> ApiError:
        if CODE_STATUS.get(code) != status:
            raise ValueError(f"S2 answers code {code!r} with {CODE_STATUS.get(code)}, not {status}")
        return cls(status, {"code": code, "message": message})

    @classmethod
    def empty(cls, status: int) -> ApiError:
        """An answer of s2-lite's HTTP stack (no route, wrong method, ...): no body."""
        return cls(status, {}, empty=True)

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
