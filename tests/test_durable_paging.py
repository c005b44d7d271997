"""The Durable Streams client against a reference server that pages its catch-up reads.

The protocol lets a server end a catch-up answer before the tail (no Stream-Up-To-Date;
the client reads on from Stream-Next-Offset), but the reference server answers with the
whole backlog, so the client's paging paths would otherwise go untested. Here the same
server runs with `--page-messages N` (tests/durable_server/start.mjs): at most N stored
messages per answer. A stored message is one append (POST), for JSON streams too: an
appended array is one stored message however many elements it has, so pages fall at
append boundaries, and the expected pages are computed from the appends' offsets.

Page sizes 1, 3 and 7 against batches of 10 and 25 appends: pages of one, and pages that
end inside a batch and straddle two.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_testbed import DurableServer

from s2_spark.durable import DurableStream, DurableStreamsClient, ReadChunk

FIRST, SECOND = 10, 25  # appends per batch; page sizes 3 and 7 divide neither
DEADLINE = 20.0  # seconds a live read may take before the test gives up (hang guard)


@pytest.fixture(scope="module", params=[1, 3, 7], ids=lambda n: f"page{n}")
def paging_server(request: pytest.FixtureRequest) -> Iterator[DurableServer]:
    """An in-memory reference server paging at `request.param` messages. Its short
    long-poll timeout keeps idle live reads (and the caught-up long-poll check) quick."""
    with DurableServer(page_messages=request.param, long_poll_timeout=0.1) as server:
        yield server


@pytest.fixture
def page(paging_server: DurableServer) -> int:
    assert paging_server.page_messages is not None
    return paging_server.page_messages


@pytest.fixture
def client(paging_server: DurableServer) -> Iterator[DurableStreamsClient]:
    with DurableStreamsClient(base_url=paging_server.url) as c:
        yield c


@pytest.fixture
def new_stream(
    client: DurableStreamsClient, unique: Callable[[str], str]
) -> Callable[[str], DurableStream]:
    def make(content_type: str) -> DurableStream:
        s = client.stream("/" + unique("paged"))
        assert s.create(content_type).created
        return s

    return make


@dataclass(frozen=True)
class Appended:
    """One append (one stored message): what it added, and the tail offset after it."""

    units: list[Any]  # JSON values, or one bytes payload for a byte stream
    offset: str


@dataclass(frozen=True)
class Page:
    """One answer the paging server must give: its units and its Stream-Next-Offset."""

    units: list[Any]
    next_offset: str


def expected_pages(appended: list[Appended], page: int, start: int = 0) -> list[Page]:
    """The answers of a read from after the first `start` appends to the tail."""
    groups = [appended[i:i + page] for i in range(start, len(appended), page)]
    return [Page([u for a in g for u in a.units], g[-1].offset) for g in groups]


def append_json(s: DurableStream, first: int, count: int) -> list[Appended]:
    """`count` appends of one JSON message each: {"i": first}, {"i": first + 1}, ..."""
    out = []
    for i in range(first, first + count):
        result = s.append_json([{"i": i}])
        assert result.next_offset is not None
        out.append(Appended([{"i": i}], result.next_offset))
    return out


def append_bytes(s: DurableStream, first: int, count: int) -> list[Appended]:
    """`count` appends of 1-4 bytes each, every append's bytes distinct from the others'."""
    out = []
    for i in range(first, first + count):
        payload = bytes([i]) * (1 + i % 4)
        result = s.append(payload)
        assert result.next_offset is not None
        out.append(Appended([payload], result.next_offset))
    return out


def chunk_pages(chunks: list[ReadChunk]) -> list[Page]:
    """The answers a StreamReader delivered, as Pages (byte data as one payload each)."""
    return [Page(c.messages() if c.json_mode else [c.data], c.next_offset) for c in chunks]


def joined(pages: list[Page]) -> list[Page]:
    """Byte-stream pages with each page's payloads concatenated (answers are bytes)."""
    return [Page([b"".join(p.units)], p.next_offset) for p in pages]


def test_the_server_really_pages(
    paging_server: DurableServer, page: int, new_stream: Callable[[str], DurableStream]
) -> None:
    """Raw HTTP: every answer but the last lacks Stream-Up-To-Date and ends at the N-th
    append; the next answer, read from its Stream-Next-Offset, continues right after."""
    s = new_stream("application/json")
    appended = append_json(s, 0, FIRST)
    pages = expected_pages(appended, page)
    assert len(pages) > 1
    with httpx.Client(base_url=paging_server.url) as http:
        path = httpx.URL(s.url).path
        offset = "-1"
        for i, want in enumerate(pages):
            resp = http.get(path, params={"offset": offset})
            assert resp.status_code == 200
            assert json.loads(resp.content) == want.units
            assert resp.headers["stream-next-offset"] == want.next_offset
            last = i == len(pages) - 1
            assert resp.headers.get("stream-up-to-date") == ("true" if last else None)
            offset = want.next_offset
        # Long-poll pages too when the client is behind ...
        behind = http.get(path, params={"offset": "-1", "live": "long-poll"})
        assert behind.status_code == 200 and json.loads(behind.content) == pages[0].units
        assert "stream-up-to-date" not in behind.headers and "stream-cursor" in behind.headers
        # ... and a caught-up long-poll still waits: it ends by timing out (204, up to date),
        # not with an empty page.
        waited = http.get(path, params={"offset": offset, "live": "long-poll"})
        assert waited.status_code == 204
        assert waited.headers["stream-next-offset"] == offset
        assert waited.headers["stream-up-to-date"] == "true"


def test_one_append_is_one_stored_message_and_never_split(
    page: int, new_stream: Callable[[str], DurableStream]
) -> None:
    """A JSON append of many elements is stored as one message, so a page holds whole
    appends: at page size 1, one answer carries all 25 elements of one append."""
    s = new_stream("application/json")
    big = s.append_json(list(range(SECOND)))
    assert big.next_offset is not None
    appended = [Appended(list(range(SECOND)), big.next_offset)]
    appended += append_json(s, SECOND, FIRST)
    chunks = list(s.read("-1"))
    assert chunk_pages(chunks) == expected_pages(appended, page)
    assert len(chunks[0].messages()) >= SECOND


@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream"])
def test_catch_up_reads_every_message_once_in_order(
    page: int, new_stream: Callable[[str], DurableStream], content_type: str
) -> None:
    """StreamReader follows the pages: exact answers, up to date only at the tail, and the
    reader ends at HEAD's offset; the same from the middle of the stream."""
    s = new_stream(content_type)
    json_mode = content_type == "application/json"
    fill = append_json if json_mode else append_bytes
    shape: Callable[[list[Page]], list[Page]] = (lambda p: p) if json_mode else joined

    first = fill(s, 0, FIRST)
    reader = s.read("-1")
    chunks = list(reader)
    assert chunk_pages(chunks) == shape(expected_pages(first, page))
    assert [c.up_to_date for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert reader.offset == s.head().next_offset == first[-1].offset

    appended = first + fill(s, FIRST, SECOND)
    middle = s.read(first[-1].offset)
    chunks = list(middle)
    assert chunk_pages(chunks) == shape(expected_pages(appended, page, start=FIRST))
    assert [c.up_to_date for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert middle.offset == s.head().next_offset == appended[-1].offset

    everything = list(s.read("-1"))
    assert chunk_pages(everything) == shape(expected_pages(appended, page))
    units = [u for a in appended for u in a.units]
    if json_mode:
        assert [m for c in everything for m in c.messages()] == units
    else:
        assert b"".join(c.data for c in everything) == b"".join(units)


@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream"])
def test_read_pieces_follow_the_pages(
    page: int, new_stream: Callable[[str], DurableStream], content_type: str
) -> None:
    """PieceReader: pieces smaller than a page, each page ends with a `last` piece at the
    page's offset, up to date only on the final page, every unit once."""
    s = new_stream(content_type)
    json_mode = content_type == "application/json"
    fill = append_json if json_mode else append_bytes
    appended = fill(s, 0, FIRST) + fill(s, FIRST, SECOND)

    for start, offset in ((0, "-1"), (FIRST, appended[FIRST - 1].offset)):
        pages: list[Page] = []
        flags: list[bool] = []
        units: list[Any] = []
        page_start = offset
        with s.read_pieces(offset, piece_bytes=8) as reader:
            for piece in reader:
                assert piece.offset == page_start
                if json_mode:
                    assert piece.messages is not None
                    units += [json.loads(m) for m in piece.messages.to_pylist()]
                else:
                    units.append(piece.data)
                if piece.last:
                    pages.append(Page(units if json_mode else [b"".join(units)],
                                      piece.next_offset))
                    flags.append(piece.up_to_date)
                    units, page_start = [], piece.next_offset
            assert reader.offset == s.head().next_offset == appended[-1].offset
        want = expected_pages(appended, page, start)
        assert pages == (want if json_mode else joined(want))
        assert flags == [False] * (len(flags) - 1) + [True]


@pytest.mark.parametrize("live", [None, "long-poll", "auto", "sse"])
def test_reads_of_a_closed_stream_page_to_eof(
    page: int, new_stream: Callable[[str], DurableStream], live: Any
) -> None:
    """Every mode pages through a closed stream and ends at EOF: `closed` only on the
    final answer, which ends at the last append."""
    s = new_stream("application/json")
    appended = append_json(s, 0, FIRST + SECOND)
    s.close()
    chunks = list(s.read("-1", live=live))
    assert chunk_pages(chunks) == expected_pages(appended, page)
    assert [c.closed for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [c.up_to_date for c in chunks] == [False] * (len(chunks) - 1) + [True]


def _raise_if_failed(writer: Future[list[Appended]] | None) -> None:
    """Surface a failed writer at once rather than as a reader waiting out its deadline."""
    if writer is not None and writer.done():
        writer.result()


@pytest.mark.parametrize("live", ["long-poll", "auto", "sse"])
def test_live_reads_catch_up_in_pages_then_tail(
    page: int, new_stream: Callable[[str], DurableStream], live: Any
) -> None:
    """A live reader pages through the backlog, and once up to date receives the appends
    of a concurrent writer, every message once and in order, ending at HEAD's offset."""
    s = new_stream("application/json")
    first = append_json(s, 0, FIRST)
    total = FIRST + SECOND
    received: list[Any] = []
    catch_up: list[ReadChunk] = []
    writer: Future[list[Appended]] | None = None
    deadline = time.monotonic() + DEADLINE
    with ThreadPoolExecutor(1) as pool, s.read("-1", live=live) as reader:
        for chunk in reader:
            received += chunk.messages()
            if writer is None:
                catch_up.append(chunk)
                if chunk.up_to_date:
                    writer = pool.submit(append_json, s, FIRST, SECOND)
            _raise_if_failed(writer)
            if len(received) >= total:
                break
            assert time.monotonic() < deadline, f"received only {len(received)} messages"
        assert writer is not None
        appended = first + writer.result(timeout=DEADLINE)
        assert reader.offset == s.head().next_offset == appended[-1].offset
    assert received == [u for a in appended for u in a.units]
    # Before the writer started, the reader saw exactly the backlog's pages.
    assert chunk_pages(catch_up) == expected_pages(first, page)
    assert [c.up_to_date for c in catch_up] == [False] * (len(catch_up) - 1) + [True]


def test_file_backed_store_pages_too(tmp_path: Path) -> None:
    """`--page-messages` wraps the file-backed store the same way."""
    with (
        DurableServer(data_dir=tmp_path / "data", page_messages=3) as server,
        DurableStreamsClient(base_url=server.url) as c,
    ):
        s = c.stream("/file-backed")
        s.create("application/json")
        appended = append_json(s, 0, FIRST)
        chunks = list(s.read("-1"))
        assert chunk_pages(chunks) == expected_pages(appended, 3)
        assert [c.up_to_date for c in chunks] == [False, False, False, True]
