"""Deleted streams and basins as s2-lite has them: deletion pending, then gone.

Each case names the s2-lite source it follows (repository s2-streamstore/s2, `lite/`):
`backend/streams.rs` (`provision_stream`, `get_stream_config`, `reconfigure_stream`,
`delete_stream`, `mark_stream_deleted`, `list_streams`), `backend/core.rs`
(`start_streamer`: a stream trimmed to the end is deletion pending), `backend/streamer.rs`
(`append_terminal_trim`; the streamer ends once it is durable), `backend/read.rs` (a
follower whose streamer is gone: `StreamerMissingInActionError`), `backend/basins.rs` and
`bgtasks/basin_deletion.rs`, `bgtasks/stream_trim.rs` (`finalize_trim` removes the
stream), `handlers/v1/error.rs` (codes and statuses).

The local server keeps a deleted stream pending for `deletion_delay` seconds (s2-lite:
until its terminal trim is durable, milliseconds), so a test can look at that state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _waiting import wait_for as until

from s2_spark.errors import (
    AlreadyExistsError,
    DeletionPendingError,
    NotFoundError,
    S2NotFoundError,
)
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing import LocalS2Server, ServerProcess

Unique = Callable[[str], str]
TRIM_TO_END = (2**64 - 1).to_bytes(8, "big")


@pytest.fixture(scope="module")
def pending_server() -> Iterator[LocalS2Server]:
    """Deleted streams and basins stay pending for the whole module."""
    with LocalS2Server(heartbeat_interval=0.5, deletion_delay=3600) as server:
        yield server


@pytest.fixture
def client(pending_server: LocalS2Server) -> Iterator[S2Client]:
    with S2Client(S2Config(endpoint=pending_server.url)) as c:
        yield c


def patch(server: LocalS2Server, path: str, basin: str | None = None) -> tuple[int, str]:
    """A reconfiguration (PATCH; the client has none) as curl would send it."""
    headers = {} if basin is None else {"s2-basin": basin}
    resp = httpx.patch(server.url + path, json={}, headers=headers, trust_env=False)
    return resp.status_code, resp.json()["code"]


def pending_code(fn: Callable[[], object]) -> tuple[int, str | None]:
    with pytest.raises(DeletionPendingError) as e:
        fn()
    assert isinstance(e.value, NotFoundError) and e.value.deletion_pending
    return e.value.status, e.value.code


def test_every_request_naming_a_deleted_stream_answers_409(pending_server: LocalS2Server,
                                                           client: S2Client,
                                                           unique: Unique) -> None:
    """`streams.rs`, `core.rs`, `handlers/v1/error.rs`: reads, tail checks, appends,
    creates, ensures, reconfigures and config lookups answer 409
    `stream_deletion_pending`; deleting it again is accepted and changes nothing."""
    basin = client.basin(unique("deleting"))
    client.create_basin(basin.name)
    basin.create_stream("s")
    stream = basin.stream("s")
    stream.append([AppendRecord(b"a"), AppendRecord(b"b")])
    basin.delete_stream("s")
    pending = (409, "stream_deletion_pending")
    assert pending_code(stream.check_tail) == pending
    assert pending_code(lambda: stream.read(seq_num=0)) == pending
    assert pending_code(lambda: list(stream.read_session(seq_num=0, count=2))) == pending
    assert pending_code(lambda: stream.append([AppendRecord(b"c")])) == pending
    assert pending_code(lambda: stream.append_many(
        [AppendRecord(b"x" * 1000) for _ in range(1500)])) == pending
    assert pending_code(lambda: basin.create_stream("s")) == pending
    assert pending_code(lambda: basin.ensure_stream("s")) == pending
    assert pending_code(lambda: basin.get_stream_config("s")) == pending
    assert patch(pending_server, "/v1/streams/s", basin.name) == pending  # reconfigure
    basin.delete_stream("s")  # again: accepted
    assert basin.check_tails(["s"]) == {"s": None}  # gone, for whoever asks many


def test_a_deleted_stream_is_listed_with_deleted_at(client: S2Client, unique: Unique) -> None:
    """`streams.rs` `list_streams`: the stream stays listed, `deleted_at` set."""
    basin = client.basin(unique("listing"))
    client.create_basin(basin.name)
    basin.create_stream("a")
    basin.create_stream("b")
    basin.delete_stream("a")
    listed = {s.name: s.deleted_at for s in basin.list_streams()}
    assert listed["b"] is None and isinstance(listed["a"], str) and listed["a"].endswith("Z")


def test_a_follower_gets_the_terminal_trim_then_unavailable(pending_server: LocalS2Server,
                                                            client: S2Client,
                                                            unique: Unique) -> None:
    """`streamer.rs` `append_terminal_trim`, `read.rs`: a session following the stream
    gets the trim-to-the-end command record, then 503 `unavailable`; the client's retry
    then meets 409 `stream_deletion_pending`, which ends it."""
    basin = client.basin(unique("follow"))
    client.create_basin(basin.name)
    basin.create_stream("s")
    stream = basin.stream("s")
    stream.append([AppendRecord(b"only")])
    before = pending_server.request_counts().get("read_session", 0)
    session = stream.read_session(seq_num=0, include_command_records=True, heartbeats=True)
    seen: list[tuple[int, bytes]] = []
    with pytest.raises(DeletionPendingError):
        for batch in session:
            seen.extend(zip(batch.batch.column("seq_num").to_pylist(),
                            batch.batch.column("body").to_pylist(), strict=True))
            if seen == [(0, b"only")]:
                basin.delete_stream("s")
    assert seen == [(0, b"only"), (1, TRIM_TO_END)]
    assert pending_server.request_counts()["read_session"] - before == 2  # one reconnect


def test_an_open_append_session_is_told_unavailable(pending_server: LocalS2Server,
                                                    unique: Unique) -> None:
    """`append.rs` `append_session`, `streamer.rs`: an append session open when the
    stream is deleted gets 503 `unavailable` for its next input (s2-sdk drives it)."""
    from s2_sdk import S2, AppendInput, Endpoints, Record, Retry, S2ServerError

    async def body() -> None:
        url = pending_server.url
        async with S2("unused", endpoints=Endpoints(url, url),
                      retry=Retry(max_attempts=1)) as s2:
            name = unique("append-session")
            await s2.create_basin(name)
            basin = s2.basin(name)
            await basin.create_stream("s")
            async with basin.stream("s").append_session() as session:
                first = await session.submit(AppendInput(records=[Record(body=b"1")]))
                assert (await first).start.seq_num == 0
                await basin.delete_stream("s")
                with pytest.raises(S2ServerError) as e:
                    ticket = await session.submit(AppendInput(records=[Record(body=b"2")]))
                    await ticket
                assert (e.value.status_code, e.value.code) == (503, "unavailable")

    with pytest.raises(S2ServerError):  # closing the session reports its failure again
        asyncio.run(asyncio.wait_for(body(), 60))


def test_a_deleted_basin_is_pending_with_its_streams(pending_server: LocalS2Server,
                                                     client: S2Client, unique: Unique) -> None:
    """`basins.rs` (`delete_basin`, `provision_basin`, `reconfigure_basin`,
    `list_basins`), `bgtasks/basin_deletion.rs` (its streams are deleted),
    `streams.rs` `provision_stream` (no stream is created in it)."""
    name = unique("basin-going")
    client.create_basin(name)
    basin = client.basin(name)
    basin.create_stream("s")
    client.delete_basin(name)
    going = (409, "basin_deletion_pending")
    assert pending_code(lambda: client.create_basin(name)) == going
    assert pending_code(lambda: client.ensure_basin(name)) == going
    assert pending_code(lambda: basin.create_stream("new")) == going
    assert pending_code(basin.stream("s").check_tail) == (409, "stream_deletion_pending")
    assert patch(pending_server, f"/v1/basins/{name}") == going
    assert patch(pending_server, "/v1/streams/s", name) == going
    listed = [b for b in client.list_basins(prefix=name)]
    assert [(b.name, b.deleted_at is not None) for b in listed] == [(name, True)]
    client.delete_basin(name)  # again: accepted


def test_a_deleted_stream_is_removed_then_not_found(s2_server: Any, unique: Unique) -> None:
    """`bgtasks/stream_trim.rs` `finalize_trim`: once removed the stream is not found
    (404), unlisted, and its name is free; the shared server removes at once, as s2-lite."""
    with S2Client(S2Config(endpoint=s2_server.url)) as c:
        basin = c.basin(unique("removed"))
        c.create_basin(basin.name)
        basin.create_stream("s")
        basin.stream("s").append([AppendRecord(b"old")])
        basin.delete_stream("s")

        def not_found() -> bool:
            try:
                basin.stream("s").check_tail()
            except DeletionPendingError:
                return False
            except S2NotFoundError as e:
                return (e.status, e.code) == (404, "stream_not_found")
            return False

        until(not_found, "the stream to be removed")
        assert [s.name for s in basin.list_streams()] == []
        basin.create_stream("s")
        assert basin.stream("s").check_tail().seq_num == 0
        with pytest.raises(AlreadyExistsError):
            basin.create_stream("s")


def test_deletion_pending_survives_a_restart_and_ends_after_it(tmp_path: Path,
                                                               unique: Unique) -> None:
    """The journal keeps the pending state (s2-lite keeps `deleted_at` and the trim point
    in its store): after kill -9 the stream is still pending, with the same `deleted_at`;
    a restart that removes at once leaves it not found, and a stream made anew under its
    name starts empty."""
    data = tmp_path / "data"
    server = ServerProcess(data_dir=data, deletion_delay=3600)
    name = unique("restart")
    with server:
        with S2Client(S2Config(endpoint=server.url)) as c:
            c.create_basin(name)
            basin = c.basin(name)
            basin.create_stream("s")
            basin.create_stream("kept")
            basin.stream("s").append([AppendRecord(b"gone")])
            basin.stream("kept").append([AppendRecord(b"stays")])
            basin.delete_stream("s")
            deleted_at = {s.name: s.deleted_at for s in basin.list_streams()}["s"]
        server.kill()
        server.start()
        with S2Client(S2Config(endpoint=server.url)) as c:
            basin = c.basin(name)
            assert pending_code(basin.stream("s").check_tail) == (409, "stream_deletion_pending")
            assert {s.name: s.deleted_at for s in basin.list_streams()}["s"] == deleted_at
        server.stop()
        server.deletion_delay = 0.0
        server.start()
        with S2Client(S2Config(endpoint=server.url)) as c:
            basin = c.basin(name)

            def removed() -> bool:
                return [s.name for s in basin.list_streams()] == ["kept"]

            until(removed, "the pending stream to be removed after the restart")
            with pytest.raises(S2NotFoundError) as e:
                basin.stream("s").check_tail()
            assert e.value.status == 404
            basin.create_stream("s")
            basin.stream("s").append([AppendRecord(b"new")])
        server.stop()
        server.start()  # replayed: removal, then the new stream
        with S2Client(S2Config(endpoint=server.url)) as c:
            basin = c.basin(name)
            read = basin.stream("s").read(seq_num=0)
            assert read.batch.column("body").to_pylist() == [b"new"]
            kept = basin.stream("kept").read(seq_num=0)
            assert kept.batch.column("body").to_pylist() == [b"stays"]


def test_the_tail_watch_stops_polling_a_stream_being_deleted(client: S2Client,
                                                             unique: Unique) -> None:
    """A long-poll of a stream being deleted answers 409 `stream_deletion_pending`: the
    stream is not quiet, and its poll ends there (asking again cannot change a 409)
    instead of failing every few seconds for good."""
    basin = client.basin(unique("watch"))
    client.create_basin(basin.name)
    basin.create_stream("here")
    basin.create_stream("gone")
    basin.delete_stream("gone")
    watch = basin.watch_tails(wait=5)
    try:
        positions = {"here": 0, "gone": 1}
        watch.watch(positions)

        def gone_poll_ended() -> bool:  # told the caller, and no poll under way
            return "gone" in watch._changed and "gone" not in watch._records

        until(gone_poll_ended, "the deleted stream's poll to end")
        until(lambda: watch.quiet(positions) == {"here"}, "only the live stream is quiet")
        watch.wait({"here"}, timeout=0.5)  # nothing arrives; no poll of "gone" starts
        assert gone_poll_ended() and watch.quiet(positions) == {"here"}
    finally:
        watch.close()
