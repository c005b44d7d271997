"""A response as the protocol clients read it: status, headers, a body read whole or in
pieces, decoded per its Content-Encoding.

Smaller than httpx's `Response` (which costs more to build than a small request's own
parsing): headers are decoded on first use, and nothing else is done per response.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

__all__ = ["Headers", "Response"]

Chunks = Iterator[bytes]


class Headers(Mapping[str, str]):
    """Response headers by lower-case name (repeated ones joined by ", ", as httpx does)."""

    __slots__ = ("_map", "_raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._map: dict[str, str] | None = None

    @property
    def raw(self) -> list[tuple[bytes, bytes]]:
        """The headers as they came, in order."""
        return self._raw

    def _decoded(self) -> dict[str, str]:
        if self._map is None:
            out: dict[str, str] = {}
            for k, v in self._raw:
                name, value = k.decode("latin-1").lower(), v.decode("latin-1")
                out[name] = f"{out[name]}, {value}" if name in out else value
            self._map = out
        return self._map

    def __getitem__(self, name: str) -> str:
        return self._decoded()[name.lower()]

    def get(self, name: str, default: Any = None) -> Any:
        return self._decoded().get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._decoded()

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def __repr__(self) -> str:
        return f"Headers({sorted(self._decoded())})"  # names only: values may be secrets


class _Decoder:
    """Undoes one Content-Encoding piece by piece (identity, gzip, deflate, zstd)."""

    def __init__(self, encoding: str) -> None:
        self._d: Any = None
        if encoding in ("gzip", "x-gzip"):
            self._d = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif encoding == "deflate":
            self._d = zlib.decompressobj()
        elif encoding == "zstd":
            import zstandard

            self._d = zstandard.ZstdDecompressor().decompressobj()
        elif encoding not in ("", "identity"):
            raise httpx.DecodingError(f"unsupported Content-Encoding {encoding!r}")

    def decode(self, data: bytes) -> bytes:
        if self._d is None:
            return data
        try:
            return bytes(self._d.decompress(data))
        except Exception as exc:  # zlib.error, zstandard.ZstdError
            raise httpx.DecodingError(f"malformed compressed body: {exc}") from exc


class Response:
    """One response. A streamed one must be read or closed (`with` closes it)."""

    __slots__ = ("_chunks", "_close", "_content", "headers", "status_code")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], *,
                 content: bytes | None = None, chunks: Chunks | None = None,
                 close: Callable[[], None] | None = None) -> None:
        self.status_code = status_code
        self.headers = Headers(headers)
        self._content = content
        self._chunks = chunks
        self._close = close

    def __repr__(self) -> str:
        return f"<Response [{self.status_code}]>"

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def content(self) -> bytes:
        """The decoded body (after `read()` for a streamed response)."""
        if self._content is None:
            raise httpx.ResponseNotRead()
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.content)

    def read(self) -> bytes:
        """Read the rest of the body, decoded."""
        if self._content is None:
            self._content = b"".join(self.iter_bytes())
        return self._content

    def iter_raw(self) -> Chunks:
        """The body as it arrives, still encoded (S2S frames carry their own compression)."""
        chunks, self._chunks = self._chunks, None
        if chunks is None:
            raise httpx.StreamConsumed()
        try:
            yield from chunks
        finally:
            self.close()

    def iter_bytes(self, chunk_size: int | None = None) -> Chunks:
        """The body decoded, in pieces of `chunk_size` bytes (the last may be shorter) or
        as it arrives."""
        if self._content is not None:
            pieces: Chunks = iter([self._content])
        else:
            decoder = _Decoder(self.headers.get("content-encoding", "").strip().lower())
            pieces = (decoder.decode(raw) for raw in self.iter_raw())
        pending = b""
        for data in pieces:
            if chunk_size is None:
                if data:
                    yield data
                continue
            pending += data
            at = 0
            while len(pending) - at >= chunk_size:
                yield pending[at:at + chunk_size]
                at += chunk_size
            pending = pending[at:]
        if pending:
            yield pending

    def close(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            close()
