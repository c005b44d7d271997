"""The error tree: service-neutral bases, each service's errors beneath them (no server).

Errors are made by the clients' own mappers from the answers the services send, so the
table below is what a caller meets, and the tree drawn in `s2_spark.errors`' docstring is
checked against the classes.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import s2_spark
from s2_spark import errors
from s2_spark._http import Response
from s2_spark.durable._errors import error_from_response
from s2_spark.errors import (
    AlreadyExistsError,
    BadRequestError,
    ConditionFailedError,
    ConflictError,
    DataLossError,
    DurableStreamsError,
    FencedError,
    FencingTokenMismatchError,
    NotFoundError,
    OffsetGoneError,
    RateLimitedError,
    ReadPastTailError,
    S2BadRequestError,
    S2Error,
    S2NotFoundError,
    S2RateLimitedError,
    S2SparkError,
    S2UnauthorizedError,
    S2UnavailableError,
    SeqNumMismatchError,
    SequenceGapError,
    ServiceError,
    StaleEpochError,
    StreamBadRequestError,
    StreamClosedError,
    StreamConflictError,
    StreamNotFoundError,
    StreamRateLimitedError,
    StreamUnauthorizedError,
    StreamUnavailableError,
    UnauthorizedError,
    UnavailableError,
)
from s2_spark.s2._errors import error_from_status

NEUTRAL = (BadRequestError, UnauthorizedError, NotFoundError, ConflictError, FencedError,
           DataLossError, RateLimitedError, UnavailableError)
RETRIED = (RateLimitedError, UnavailableError)

#: Errors only one service has (no neutral base), besides the services' roots.
SERVICE_ONLY = {"ConditionFailedError", "SeqNumMismatchError", "ReadPastTailError",
                "SequenceGapError", "MalformedResponseError"}


def s2(status: int, **info: Any) -> S2Error:
    return error_from_status(status, info, "stream 's' in basin 'b'")


def ds(status: int, **headers: str) -> DurableStreamsError:
    raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return error_from_response(Response(status, raw, content=b"said so"), "stream '/s'", "o1")


#: (what the service answered, the class the client raises, its neutral base).
S2_ANSWERS = [
    (lambda: s2(400), S2BadRequestError, BadRequestError),
    (lambda: s2(422), S2BadRequestError, BadRequestError),
    (lambda: s2(401), S2UnauthorizedError, UnauthorizedError),
    (lambda: s2(403), S2UnauthorizedError, UnauthorizedError),
    (lambda: s2(404), S2NotFoundError, NotFoundError),
    (lambda: s2(409, code="resource_already_exists"), AlreadyExistsError, ConflictError),
    (lambda: s2(412, fencing_token_mismatch="t2"), FencingTokenMismatchError, FencedError),
    (lambda: s2(429), S2RateLimitedError, RateLimitedError),
    (lambda: s2(503), S2UnavailableError, UnavailableError),
    (lambda: s2(408), S2UnavailableError, UnavailableError),
    (lambda: s2(409, code="transaction_conflict"), S2UnavailableError, UnavailableError),
]
DS_ANSWERS = [
    (lambda: ds(400), StreamBadRequestError, BadRequestError),
    (lambda: ds(401), StreamUnauthorizedError, UnauthorizedError),
    (lambda: ds(403), StreamUnauthorizedError, UnauthorizedError),
    (lambda: ds(404), StreamNotFoundError, NotFoundError),
    (lambda: ds(409), StreamConflictError, ConflictError),
    (lambda: ds(409, stream_closed="true"), StreamClosedError, ConflictError),
    (lambda: ds(403, producer_epoch="7"), StaleEpochError, FencedError),
    (lambda: ds(410), OffsetGoneError, DataLossError),
    (lambda: ds(429), StreamRateLimitedError, RateLimitedError),
    (lambda: ds(503), StreamUnavailableError, UnavailableError),
]


def exception_classes() -> dict[str, type[BaseException]]:
    return {name: obj for name, obj in vars(errors).items()
            if isinstance(obj, type) and issubclass(obj, BaseException)}


def test_neutral_bases_sit_right_under_service_error() -> None:
    for base in NEUTRAL:
        assert base.__bases__ == (ServiceError,), base
        assert base.retryable is (base in RETRIED), base


@pytest.mark.parametrize(("answer", "raised", "neutral"), S2_ANSWERS,
                         ids=[f"s2-{c.__name__}" for _, c, _ in S2_ANSWERS])
def test_every_s2_error_is_its_neutral_base(answer: Any, raised: type, neutral: type) -> None:
    err = answer()
    assert type(err) is raised
    assert isinstance(err, neutral) and isinstance(err, S2Error)
    assert not isinstance(err, DurableStreamsError)
    assert err.retryable is (neutral in RETRIED)


@pytest.mark.parametrize(("answer", "raised", "neutral"), DS_ANSWERS,
                         ids=[f"ds-{c.__name__}" for _, c, _ in DS_ANSWERS])
def test_every_durable_error_is_its_neutral_base(answer: Any, raised: type,
                                                 neutral: type) -> None:
    err = answer()
    assert type(err) is raised
    assert isinstance(err, neutral) and isinstance(err, DurableStreamsError)
    assert not isinstance(err, S2Error)
    assert err.retryable is (neutral in RETRIED)


@pytest.mark.parametrize(("answer", "raised", "root"), [
    (lambda: s2(412, seq_num_mismatch=5), SeqNumMismatchError, S2Error),
    (lambda: s2(416, tail={"seq_num": 5, "timestamp": 9}), ReadPastTailError, S2Error),
    (lambda: ds(409, producer_expected_seq="3", producer_received_seq="5"), SequenceGapError,
     DurableStreamsError),
], ids=["SeqNumMismatchError", "ReadPastTailError", "SequenceGapError"])
def test_errors_of_one_service_only_have_no_neutral_base(answer: Any, raised: type,
                                                         root: type) -> None:
    err = answer()
    assert type(err) is raised and isinstance(err, root)
    assert not any(isinstance(err, base) for base in NEUTRAL)
    assert raised.__name__ in SERVICE_ONLY


def test_every_service_error_has_a_neutral_base_or_is_one_services_own() -> None:
    for name, cls in exception_classes().items():
        if cls in (S2Error, DurableStreamsError) or not issubclass(
            cls, S2Error | DurableStreamsError
        ):
            continue
        bases = [b for b in NEUTRAL if issubclass(cls, b)]
        assert (name in SERVICE_ONLY) == (not bases), (name, bases)


def test_a_not_found_of_either_service_is_caught_as_not_found() -> None:
    caught = []
    for err in (s2(404), ds(404)):
        try:
            raise err
        except NotFoundError as e:
            caught.append((type(e), e.status))
    assert caught == [(S2NotFoundError, 404), (StreamNotFoundError, 404)]
    with pytest.raises(S2Error):  # code catching S2's family still catches S2's not-found
        raise s2(404)
    with pytest.raises(NotFoundError) as e:
        raise ds(404)
    assert str(e.value) == "stream '/s' was not found: said so; create it first or check the URL"


def test_the_denied_durable_answer_names_the_credential_options() -> None:
    err = ds(401)
    assert (err.status, str(err)) == (401, "the server denied access to stream '/s' (HTTP 401): "
                                      "said so; check the credentials (options bearerToken, "
                                      "secretHeaders; DurableConfig.headers)")


def test_fenced_and_lost_keep_their_service_details() -> None:
    fenced = s2(412, fencing_token_mismatch="t2")
    assert isinstance(fenced, ConditionFailedError) and fenced.expected_token == "t2"
    stale = ds(403, producer_epoch="7")
    assert (stale.status, stale.current_epoch) == (403, 7)
    gone = ds(410)
    assert (gone.status, gone.code, gone.offset) == (410, "gone", "o1")
    assert (gone.stream, gone.start, gone.end) == (None, None, None)
    lost = DataLossError("lost", stream="s", start=3, end=7)
    assert (lost.stream, lost.start, lost.end, lost.status, lost.retryable) == ("s", 3, 7, 0,
                                                                                False)


def test_the_old_s2_names_still_catch_what_they_caught() -> None:
    """`NotFoundError` and the rest were S2's classes; S2's errors still derive from them."""
    for err, old in ((s2(400), s2_spark.BadRequestError), (s2(401), s2_spark.UnauthorizedError),
                     (s2(404), s2_spark.NotFoundError), (s2(429), s2_spark.RateLimitedError),
                     (s2(503), s2_spark.UnavailableError)):
        assert isinstance(err, old) and isinstance(err, s2_spark.S2Error)


def test_the_package_exports_every_error() -> None:
    for name, cls in exception_classes().items():
        assert getattr(s2_spark, name) is cls and name in s2_spark.__all__
        assert issubclass(cls, S2SparkError)


def drawn_tree() -> list[tuple[int, str, str]]:
    """(column, class name, rest of the line) of each line of the docstring's tree."""
    doc = errors.__doc__ or ""
    block = doc.split("```text\n", 1)[1].split("```", 1)[0]
    rows = []
    for line in block.splitlines():
        m = re.search(r"[A-Z]\w*Error", line)
        assert m, line
        rows.append((m.start(), m.group(), line[m.end():]))
    return rows


def test_the_docstring_draws_every_class_under_its_bases() -> None:
    classes = exception_classes()
    rows = drawn_tree()
    assert {name for _, name, _ in rows} == set(classes)
    parents: list[tuple[int, str]] = []
    for col, name, rest in rows:
        while parents and parents[-1][0] >= col:
            parents.pop()
        if parents:
            assert issubclass(classes[name], classes[parents[-1][1]]), (name, parents[-1])
        parents.append((col, name))
        service = re.search(r"\s(S2|DS)(,|$)", rest)
        if service:
            root = S2Error if service.group(1) == "S2" else DurableStreamsError
            assert issubclass(classes[name], root), name
