"""The key of S2's encrypted streams, checked before any request and never echoed.

S2 takes it in the `s2-encryption-key` header of every append and read of a stream whose
basin set a `stream_cipher`, as standard padded base64 of exactly 32 bytes (44
characters); anything else is refused, but only by the request that meets an encrypted
stream. Checking it up front makes a typo fail at once, everywhere. Messages say what
was wrong with a value (its type, length, alphabet), never the value.
"""

from __future__ import annotations

import base64
import binascii

__all__ = ["KEY_BYTES", "check_encryption_key"]

#: Both of S2's ciphers (AEGIS-256, AES-256-GCM) take 256-bit keys.
KEY_BYTES = 32


def check_encryption_key(value: object, name: str) -> str:
    """`value` as S2 takes it (surrounding whitespace dropped), or ValueError naming
    `name` and what is accepted."""
    problem = _problem(value)
    if problem is None:
        assert isinstance(value, str)
        return value.strip()
    raise ValueError(
        f"{name} must be the base64 of exactly {KEY_BYTES} bytes (standard alphabet, "
        f"padded: 44 characters, as `base64.b64encode(os.urandom(32))` makes one); "
        f"got {problem}"
    )


def _problem(value: object) -> str | None:
    """What is wrong with `value` as a key, in words that do not reveal it."""
    if not isinstance(value, str):
        return f"a value of type {type(value).__name__}"
    text = value.strip()
    if not text:
        return "an empty string"
    try:
        material = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return f"a string of {len(text)} characters that is not padded standard base64"
    if base64.b64encode(material).decode() != text:
        return f"a string of {len(text)} characters that is not canonical base64"
    if len(material) != KEY_BYTES:
        return f"the base64 of {len(material)} bytes"
    return None
