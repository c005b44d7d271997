"""Stream ciphers as s2-lite applies them: which requests need the key, and records sealed
at rest.

A basin's `stream_cipher` (`aegis-256`, `aes-256-gcm`) is copied into each stream it
creates and fixed for the stream's life (s2-lite `lite/src/backend/streams.rs`). Appends
and reads (not tail checks) carry the key in `s2-encryption-key`, base64 of 32 bytes
(`common/src/encryption.rs`); the key is checked only against the stream's cipher, so an
append with another key succeeds, and the read that meets its records fails with 400
`decryption_failed` (`storage/src/record/encryption.rs`, `lite/src/handlers/v1/error.rs`).
Command records are stored in the clear; every other record is sealed whole, with a fresh
random nonce, the basin and stream names as associated data.

The key lives only in the `Sealer` of one request: it is never stored, journaled, logged
or quoted in an error. Ciphers come from `cryptography` (AES-256-GCM) and PyNaCl
(AEGIS-256, libsodium's, whose tag is 32 bytes where s2-lite's is 16: not observable),
both in the `server` extra, imported when a cipher is first used.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from s2_spark.testing.semantics.errors import ApiError

__all__ = ["CIPHERS", "KEY_HEADER", "Sealer", "check_cipher", "key_from_header", "resolve"]

KEY_HEADER = "s2-encryption-key"
CIPHERS = ("aegis-256", "aes-256-gcm")
#: s2-lite's header bound: the base64 of 32 bytes is 44 characters.
_MAX_KEY_HEADER_LEN = 44
#: A sealed record: format byte (s2-lite's ids), nonce, ciphertext with its tag. A stored
#: record in the clear is a ReadBatch entry, whose first byte is 0x0a: never one of these.
_FORMAT = {"aegis-256": 0x01, "aes-256-gcm": 0x02}
_NONCE_LEN = {"aegis-256": 32, "aes-256-gcm": 12}

#: (key, nonce, data, aad) -> sealed data; its inverse raises on a failed tag.
_Aead = Callable[[bytes, bytes, bytes, bytes], bytes]


def check_cipher(value: object) -> str | None:
    """A basin's `stream_cipher` as given in a config: null or a known cipher (else
    400 `bad_json`, as s2-lite's JSON extraction answers an unknown variant); a cipher
    needs the packages that implement it (else 501)."""
    if value is None:
        return None
    if value not in CIPHERS:
        raise ApiError.bad(
            "bad_json",
            f"stream_cipher: unknown variant {value!r}, expected `aegis-256` or `aes-256-gcm`",
        )
    _aead(str(value))
    return str(value)


def key_from_header(headers: dict[str, str]) -> str | None:
    """The request's key material, trimmed, before any stream is looked at (s2-lite's
    request extraction): absent is None; non-ASCII or outside 1..44 characters is 400
    `bad_header`, whatever the stream's cipher. The message never quotes the value."""
    raw = headers.get(KEY_HEADER)
    if raw is None:
        return None
    if any(not (" " <= c <= "~" or c == "\t") for c in raw):
        raise ApiError.bad("bad_header", f"Invalid header `{KEY_HEADER}`: not UTF-8")
    value = raw.strip()
    if not 1 <= len(value) <= _MAX_KEY_HEADER_LEN:
        raise ApiError.bad(
            "bad_header",
            f"Invalid header `{KEY_HEADER}`: invalid encryption key: key material length "
            f"{len(value)} is out of range",
        )
    return value


@dataclass(frozen=True, slots=True)
class Sealer:
    """A stream's cipher with one request's key: seals appended records, opens read ones."""

    cipher: str
    key: bytes = field(repr=False)
    aad: bytes

    def seal(self, entry: bytes) -> bytes:
        seal, _ = _aead(self.cipher)
        nonce = os.urandom(_NONCE_LEN[self.cipher])
        return bytes((_FORMAT[self.cipher],)) + nonce + seal(self.key, nonce, entry, self.aad)

    def open(self, stored: bytes) -> bytes:
        """A stored record in the clear: as it is; a sealed one opened, or 400
        `decryption_failed` when the key is not the one it was sealed with."""
        if stored[0] != _FORMAT[self.cipher]:
            return stored
        _, open_ = _aead(self.cipher)
        n = 1 + _NONCE_LEN[self.cipher]
        try:
            return open_(self.key, stored[1:n], stored[n:], self.aad)
        except Exception as e:  # the libraries' authentication errors
            raise ApiError.bad("decryption_failed", "record decryption failed") from e

    def seal_all(self, entries: list[bytes], clear: set[int]) -> list[bytes]:
        """`entries` sealed, except those at the indexes in `clear` (command records)."""
        return [e if i in clear else self.seal(e) for i, e in enumerate(entries)]


def resolve(cipher: str | None, key: str | None, basin: str, stream: str) -> Sealer | None:
    """s2-lite's `EncryptionSpec::resolve`: a stream without a cipher ignores any key;
    one with a cipher needs a key that is canonical padded base64 of exactly 32 bytes
    (else 400 `bad_header` saying which)."""
    if cipher is None:
        return None
    if key is None:
        raise ApiError.bad("bad_header", f"missing encryption key for stream cipher '{cipher}'")
    try:
        material = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        material = None
    if material is None or base64.b64encode(material).decode() != key:
        raise ApiError.bad(
            "bad_header", f"invalid encryption key for stream cipher '{cipher}': invalid base64"
        )
    if len(material) != 32:
        raise ApiError.bad(
            "bad_header",
            f"invalid encryption key length for stream cipher '{cipher}': {len(material)}",
        )
    return Sealer(cipher, material, basin.encode() + b"\x00" + stream.encode())


@functools.cache
def _aead(cipher: str) -> tuple[_Aead, _Aead]:
    """The (seal, open) pair of a cipher, or 501 when its package is not installed."""
    try:
        if cipher == "aes-256-gcm":
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            return (lambda k, n, d, a: AESGCM(k).encrypt(n, d, a),
                    lambda k, n, d, a: AESGCM(k).decrypt(n, d, a))
        from nacl.bindings import crypto_aead_aegis256_decrypt, crypto_aead_aegis256_encrypt

        return (lambda k, n, d, a: crypto_aead_aegis256_encrypt(d, a, n, k),
                lambda k, n, d, a: crypto_aead_aegis256_decrypt(d, a, n, k))
    except ImportError as e:
        raise ApiError.standard(
            501,
            "not_implemented",
            f"stream cipher {cipher!r} needs the local server's packages: "
            "pip install 's2-spark[server]' (cryptography, pynacl)",
        ) from e
