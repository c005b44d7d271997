"""S2's error codes and what the client does with each, as S2 and its SDK say.

The reference is s2-lite's repository (s2-streamstore/s2): `api/src/v1/error.rs`
(`ErrorCode`, `status()`, `is_retryable()`, `has_no_side_effects()`), applied to an
answer as `sdk/src/error.rs` applies them (`server_error_is_retryable`,
`server_error_has_no_side_effects`), and retried as `sdk/src/api.rs` retries
(`is_safe_to_retry`, `retry-after-ms`). The expectations below are written from those
three `match` blocks, apart from the client's own table, so a slip in either shows.

The retry decisions are checked on real requests: the local server's test-only fault
hook (`LocalS2Server.inject_fault`) answers the chosen error to the next requests of a
kind, scoped to the test's basin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from s2_spark._http import Response
from s2_spark._long_poll import Answer, Pause
from s2_spark.errors import (
    AlreadyExistsError,
    DeletionPendingError,
    EncryptionKeyError,
    NotFoundError,
    S2BadRequestError,
    S2Error,
    S2NotFoundError,
    S2RateLimitedError,
    S2UnauthorizedError,
    S2UnavailableError,
)
from s2_spark.s2 import AppendRecord, RetryPolicy, S2Client, S2Config
from s2_spark.s2._error_codes import ERROR_CODES, has_no_side_effects, is_retryable
from s2_spark.s2._errors import error_from_body, error_from_status
from s2_spark.s2._watch import _failed

# -- the table, from api/src/v1/error.rs ----------------------------------------------------

#: `ErrorCode::status()`.
STATUS = {
    "authn": 401,
    **dict.fromkeys(["decryption_failed", "bad_frame", "bad_header", "bad_json", "bad_path",
                     "bad_proto", "bad_query"], 400),
    **dict.fromkeys(["permission_denied", "quota_exhausted"], 403),
    **dict.fromkeys(["access_token_not_found", "basin_not_found", "stream_not_found"], 404),
    "request_timeout": 408,
    **dict.fromkeys(["basin_deletion_pending", "resource_already_exists",
                     "stream_deletion_pending", "transaction_conflict"], 409),
    "invalid": 422,
    "not_implemented": 501,
    "rate_limited": 429,
    "client_hangup": 499,
    **dict.fromkeys(["other", "storage"], 500),
    "hot_server": 502,
    **dict.fromkeys(["server_draining", "unavailable"], 503),
    "upstream_timeout": 504,
}
#: `ErrorCode::is_retryable()` is true for exactly these.
RETRYABLE = {"request_timeout", "transaction_conflict", "rate_limited", "other",
             "server_draining", "storage", "hot_server", "unavailable", "upstream_timeout"}
#: `ErrorCode::has_no_side_effects()` is false for exactly these.
SIDE_EFFECTS_POSSIBLE = {"client_hangup", "other", "request_timeout", "storage",
                         "unavailable", "upstream_timeout"}

#: The class each code is raised as (what went wrong, for `except`).
CLASS: dict[str, type[S2Error]] = {
    **dict.fromkeys([c for c, s in STATUS.items() if s in (400, 422)], S2BadRequestError),
    **dict.fromkeys([c for c, s in STATUS.items() if s in (401, 403)], S2UnauthorizedError),
    **dict.fromkeys([c for c, s in STATUS.items() if s == 404], S2NotFoundError),
    "decryption_failed": EncryptionKeyError,  # a subclass of S2BadRequestError
    "basin_deletion_pending": DeletionPendingError,
    "stream_deletion_pending": DeletionPendingError,
    "resource_already_exists": AlreadyExistsError,
    "transaction_conflict": S2UnavailableError,
    "rate_limited": S2RateLimitedError,
    "not_implemented": S2Error,
    "client_hangup": S2Error,
    **dict.fromkeys([c for c, s in STATUS.items() if s in (408, 500, 502, 503, 504)],
                    S2UnavailableError),
}


def answer(status: int, code: str | None) -> S2Error:
    info: dict[str, Any] = {"message": "said so"}
    if code is not None:
        info["code"] = code
    return error_from_status(status, info, "stream 's' in basin 'b'")


def test_the_client_knows_every_code_of_s2() -> None:
    assert set(ERROR_CODES) == set(STATUS)
    assert {c: e.status for c, e in ERROR_CODES.items()} == STATUS


@pytest.mark.parametrize("code", sorted(STATUS))
def test_each_code_is_classified_as_s2_says(code: str) -> None:
    err = answer(STATUS[code], code)
    assert type(err) is CLASS[code]
    assert (err.status, err.code) == (STATUS[code], code)
    assert err.retryable is (code in RETRYABLE)
    assert err.unsent is (code not in SIDE_EFFECTS_POSSIBLE)  # no side effect
    assert (is_retryable(STATUS[code], code), has_no_side_effects(STATUS[code], code)) == (
        code in RETRYABLE, code not in SIDE_EFFECTS_POSSIBLE)


def test_the_wanted_outcomes_of_the_issue() -> None:
    unavailable = answer(503, "unavailable")
    assert unavailable.retryable and not unavailable.unsent  # may have landed
    for code in ("server_draining", "transaction_conflict", "rate_limited", "hot_server"):
        err = answer(STATUS[code], code)
        assert err.retryable and err.unsent, code  # retried, even for a blind append
    assert not answer(501, "not_implemented").retryable


def test_a_known_code_with_another_status_fails_closed() -> None:
    """`sdk/src/error.rs` `server_classification_fails_closed_on_status_mismatch`."""
    for status, code in ((500, "rate_limited"), (503, "stream_not_found"), (409, "unavailable")):
        err = answer(status, code)
        assert not err.retryable and not err.unsent, (status, code)


@pytest.mark.parametrize("status", [400, 404, 408, 409, 429, 500, 501, 502, 503, 504, 599])
def test_an_unknown_code_falls_back_to_its_status(status: int) -> None:
    """`sdk/src/error.rs` `unknown_codes_retain_retryable_status_fallback`: retried on 408,
    429 and 500/502/503/504, never side-effect free; no code at all (a proxy's page) too."""
    for code in ("introduced_by_a_newer_server", None):
        err = answer(status, code)
        assert err.retryable is (status in (408, 429, 500, 502, 503, 504)), (status, code)
        assert not err.unsent


def test_retry_after_ms_is_read_from_the_answer() -> None:
    said = b'{"code": "rate_limited", "message": "slow down"}'
    err = error_from_body(429, said, "t", {"retry-after-ms": "1500"})
    assert err.retry_after == 1.5
    assert error_from_body(429, said, "t", {"retry-after-ms": "soon"}).retry_after is None
    assert error_from_body(429, said, "t").retry_after is None


def test_the_watch_stops_on_what_retrying_cannot_change() -> None:
    """The tail watch's long-poll answers, by the same table."""
    def resp(status: int, code: str, **headers: str) -> Response:
        raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
        return Response(status, raw, content=b'{"code": "%s", "message": ""}' % code.encode())

    assert _failed(resp(409, "stream_deletion_pending"), "s") is Answer.GONE
    assert _failed(resp(404, "stream_not_found"), "s") is Answer.GONE
    assert _failed(resp(501, "not_implemented"), "s") is Answer.GONE
    assert _failed(resp(503, "unavailable"), "s") is Answer.FAILED
    assert _failed(resp(429, "rate_limited", retry_after_ms="2500"), "s") == Pause(2.5)


# -- retry decisions on real requests ---------------------------------------------------------

FAST = RetryPolicy(initial_backoff=0.01, max_backoff=0.02, timeout=30.0)


@pytest.fixture
def env(s2_server: Any, unique: Callable[[str], str]) -> Iterator[tuple[Any, S2Client, str]]:
    with S2Client(S2Config(endpoint=s2_server.url, retry=FAST)) as client:
        basin = unique("codes")
        client.create_basin(basin)
        client.basin(basin).create_stream("s")
        yield s2_server, client, basin


def count(server: Any, kind: str) -> int:
    return int(server.request_counts().get(kind, 0))


@pytest.mark.local_server  # the local server's fault hook
def test_an_unconditioned_append_answered_unavailable_is_outcome_unknown(env: Any) -> None:
    """503 `unavailable` guarantees nothing: the append may have landed (here it did), so
    it is raised as outcome unknown and not sent again (`sdk/src/api.rs`
    `is_safe_to_retry` under `AppendRetryPolicy::NoSideEffects`)."""
    server, client, basin = env
    stream = client.basin(basin).stream("s")
    server.inject_fault("append", 503, "unavailable", basin=basin, landed=True)
    before = count(server, "append")
    with pytest.raises(S2UnavailableError, match="may or may not have been applied") as e:
        stream.append([AppendRecord(b"once")])
    assert (e.value.status, e.value.code) == (503, "unavailable")
    assert count(server, "append") - before == 1
    assert [b for b in stream.read(seq_num=0).batch.column("body").to_pylist()] == [b"once"]


@pytest.mark.local_server  # the local server's fault hook
def test_an_append_session_answered_unavailable_is_outcome_unknown(env: Any) -> None:
    server, client, basin = env
    stream = client.basin(basin).stream("s")
    server.inject_fault("append_session", 503, "unavailable", basin=basin)
    before = count(server, "append_session")
    records = [AppendRecord(b"x" * 1000) for _ in range(1500)]  # two batches: a session
    with pytest.raises(S2UnavailableError, match="outcome of the next batch is unknown"):
        stream.append_many(records)
    assert count(server, "append_session") - before == 1
    # A terminal frame says the same as a status.
    server.inject_fault("append_session", 503, "unavailable", basin=basin, terminal=True)
    with pytest.raises(S2UnavailableError, match="outcome of the next batch is unknown"):
        stream.append_many(records)
    assert count(server, "append_session") - before == 2
    assert stream.check_tail().seq_num == 0


@pytest.mark.local_server  # the local server's fault hook
@pytest.mark.parametrize(("status", "code"), [(503, "server_draining"),
                                              (409, "transaction_conflict"),
                                              (429, "rate_limited"), (502, "hot_server")])
def test_side_effect_free_answers_are_retried_even_for_a_blind_append(
        env: Any, status: int, code: str) -> None:
    server, client, basin = env
    stream = client.basin(basin).stream("s")
    server.inject_fault("append", status, code, basin=basin, times=2)
    before = count(server, "append")
    ack = stream.append([AppendRecord(b"one")])
    assert (ack.start.seq_num, ack.end.seq_num) == (0, 1)
    assert count(server, "append") - before == 3
    server.inject_fault("append_session", status, code, basin=basin, terminal=True)
    ack = stream.append_many([AppendRecord(b"y" * 1000) for _ in range(1500)])
    assert (ack.start.seq_num, ack.end.seq_num) == (1, 1501)


@pytest.mark.local_server  # the local server's fault hook
def test_retry_after_ms_is_waited_for(env: Any) -> None:
    """`sdk/src/api.rs`: the pause is at least `retry-after-ms` (here far above the
    policy's backoff, 10-30 ms); the server's own clock shows the gaps."""
    server, client, basin = env
    fault = server.inject_fault("check_tail", 429, "rate_limited", basin=basin, times=2,
                                retry_after_ms=300)
    assert client.basin(basin).stream("s").check_tail().seq_num == 0
    gap = fault.fired[1] - fault.fired[0]
    assert gap >= 0.3


@pytest.mark.local_server  # the local server's fault hook
def test_retry_after_ms_past_the_deadline_ends_the_retries(env: Any) -> None:
    server, client, basin = env
    fault = server.inject_fault("check_tail", 503, "server_draining", basin=basin,
                                retry_after_ms=60_000)
    with pytest.raises(S2UnavailableError, match="asked to wait 60s before retrying") as e:
        client.basin(basin).stream("s").check_tail()
    assert "retryTimeoutMs" in str(e.value)
    assert len(fault.fired) == 1


@pytest.mark.local_server  # the local server's fault hook
def test_not_implemented_and_other_final_answers_fail_at_once(env: Any) -> None:
    server, client, basin = env
    stream = client.basin(basin).stream("s")
    for status, code, raised in ((501, "not_implemented", S2Error),
                                 (403, "quota_exhausted", S2UnauthorizedError),
                                 (400, "bad_query", S2BadRequestError)):
        before = count(server, "check_tail")
        server.inject_fault("check_tail", status, code, basin=basin)
        with pytest.raises(raised) as e:
            stream.check_tail()
        assert (type(e.value), e.value.status, e.value.code) == (raised, status, code)
        assert count(server, "check_tail") - before == 1, code


@pytest.mark.local_server  # the local server's fault hook
def test_an_unknown_code_is_retried_by_its_status(env: Any) -> None:
    server, client, basin = env
    stream = client.basin(basin).stream("s")
    server.inject_fault("check_tail", 503, "introduced_by_a_newer_server", basin=basin)
    assert stream.check_tail().seq_num == 0
    server.inject_fault("append", 503, "introduced_by_a_newer_server", basin=basin)
    with pytest.raises(S2UnavailableError, match="may or may not have been applied"):
        stream.append([AppendRecord(b"blind")])


@pytest.mark.local_server  # the local server's fault hook
def test_a_read_session_resumes_after_a_retryable_terminal_frame(env: Any) -> None:
    server, client, basin = env
    stream = client.basin(basin).stream("s")
    stream.append_many([AppendRecord(f"r{i}".encode()) for i in range(10)])
    server.inject_fault("read_session", 503, "unavailable", basin=basin, terminal=True)
    session = stream.read_session(seq_num=0, count=10)
    got = [n for b in session for n in b.batch.column("seq_num").to_pylist()]
    assert got == list(range(10))
    assert session.reconnects == 1
    server.inject_fault("read_session", 409, "stream_deletion_pending", basin=basin,
                        terminal=True)
    with pytest.raises(DeletionPendingError) as e:
        list(stream.read_session(seq_num=0, count=10))
    assert isinstance(e.value, NotFoundError) and e.value.deletion_pending


def test_the_fault_hook_answers_over_http_too(tmp_path: Any, unique: Callable[[str], str]
                                              ) -> None:
    """`ServerProcess.inject_fault` arms it over the testing-only `POST /_local/faults`."""
    from s2_spark.testing import ServerProcess

    with ServerProcess(heartbeat_interval=0.5) as server, \
            S2Client(S2Config(endpoint=server.url, retry=FAST)) as client:
        basin = unique("codes")
        client.create_basin(basin)
        client.basin(basin).create_stream("s")
        server.inject_fault("check_tail", 501, "not_implemented", basin=basin)
        with pytest.raises(S2Error, match="does not implement") as e:
            client.basin(basin).stream("s").check_tail()
        assert (e.value.status, e.value.code, e.value.attempts) == (501, "not_implemented", 1)
        assert server.request_counts()["check_tail"] == 1
