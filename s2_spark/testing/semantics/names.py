"""S2's rules for basin and stream names, and the error a bad name gets where it was given.

A name that breaks a rule is a 422 `invalid` from the store; where the name came in a
path or a JSON body, s2-lite answers a 400 naming that place (`bad_path`, `bad_json`).
"""

from __future__ import annotations

from collections.abc import Callable

from s2_spark.testing.semantics.errors import ApiError

__all__ = [
    "checked_name",
    "stream_in_path",
    "validate_basin_name",
    "validate_basin_prefix",
    "validate_stream_name",
    "validate_stream_prefix",
]


def validate_basin_name(name: str, what: str = "name") -> None:
    """S2's basin name rules (8-48 bytes of [a-z0-9-], no hyphen at either end)."""
    if len(name.encode()) > 48:
        raise ApiError.invalid(f"basin {what} must not exceed 48 bytes in length")
    if len(name.encode()) < 8:
        raise ApiError.invalid(f"basin {what} should be at least 8 bytes in length")
    if not (name[0].islower() or name[0].isdigit()) or not name[0].isascii():
        raise ApiError.invalid(f"basin {what} must begin with a lowercase letter or number")
    if not (name[-1].islower() or name[-1].isdigit()) or not name[-1].isascii():
        raise ApiError.invalid(f"basin {what} must end with a lowercase letter or number")
    for c in name:
        if not (c.isascii() and (c.islower() or c.isdigit() or c == "-")):
            raise ApiError.invalid(
                f"basin {what} must comprise lowercase letters, numbers, and hyphens"
            )


def validate_basin_prefix(value: str, what: str = "prefix") -> None:
    """A listing's basin prefix or cursor (s2 `common/src/basin.rs`, `IS_PREFIX`): at most
    48 bytes of [a-z0-9-], not starting with a hyphen; may be empty."""
    if len(value.encode()) > 48:
        raise ApiError.invalid(f"basin {what} must not exceed 48 bytes in length")
    if not value:
        return
    if not (value[0].isascii() and (value[0].islower() or value[0].isdigit())):
        raise ApiError.invalid(f"basin {what} must begin with a lowercase letter or number")
    for c in value:
        if not (c.isascii() and (c.islower() or c.isdigit() or c == "-")):
            raise ApiError.invalid(
                f"basin {what} must comprise lowercase letters, numbers, and hyphens"
            )


def validate_stream_prefix(value: str, what: str = "prefix") -> None:
    """A listing's stream prefix or cursor (s2 `common/src/stream.rs`, `IS_PREFIX`): at
    most 512 bytes; may be empty, ".", or ".."."""
    if len(value.encode()) > 512:
        raise ApiError.invalid(f"stream {what} must not exceed 512 bytes in length")


def validate_stream_name(name: str, what: str = "name") -> None:
    """S2's stream name rules: 1-512 bytes, not "." or ".."."""
    if not name:
        raise ApiError.invalid(f"stream {what} must not be empty")
    if name in (".", ".."):
        raise ApiError.invalid(f'stream {what} must not be "." or ".."')
    if len(name.encode()) > 512:
        raise ApiError.invalid(f"stream {what} must not exceed 512 bytes in length")


def checked_name(validate: Callable[[str], None], name: str, code: str, what: str) -> str:
    """Validate a name; a bad one is a 400 with `code` (bad_json, bad_path), as in s2-lite."""
    try:
        validate(name)
    except ApiError as e:
        # In a path, axum's rejection: "Invalid URL: ..." (s2 `lite/src/handlers/v1/error.rs`).
        where = "Invalid URL" if code == "bad_path" else f"invalid {what} name"
        raise ApiError.bad(code, f"{where}: {e.body['message']}") from e
    return name


def stream_in_path(name: str) -> str:
    """A stream name from the path, or a 400 `bad_path` naming what is wrong with it."""
    return checked_name(validate_stream_name, name, "bad_path", "stream")
