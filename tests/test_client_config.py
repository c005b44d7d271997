"""S2Config / RetryPolicy / value types: validation, env fallbacks, endpoints, no token leaks."""

from __future__ import annotations

import pytest

from s2_spark.errors import BadRequestError
from s2_spark.s2 import (
    AppendRecord,
    ReadLimits,
    RetryPolicy,
    S2Client,
    S2Config,
    StreamConfig,
)

TOKEN = "tok-SECRET-0123456789"


def test_repr_hides_token() -> None:
    cfg = S2Config(access_token=TOKEN, endpoint="http://127.0.0.1:1")
    assert TOKEN not in repr(cfg)
    assert TOKEN not in str(cfg)
    assert "access_token='***'" in repr(cfg)
    with S2Client(cfg) as client:
        assert TOKEN not in repr(client)
        assert TOKEN not in repr(client.basin("basin-abcdefgh"))
        assert TOKEN not in repr(client.basin("basin-abcdefgh").stream("s"))
    assert "access_token=None" in repr(S2Config())


def test_config_is_frozen() -> None:
    cfg = S2Config()
    with pytest.raises(AttributeError):
        cfg.access_token = "x"  # type: ignore[misc]


def test_from_env_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S2_ACCESS_TOKEN", TOKEN)
    monkeypatch.setenv("S2_ACCOUNT_ENDPOINT", "https://acct.example")
    monkeypatch.setenv("S2_BASIN_ENDPOINT", "https://{basin}.basins.example")
    monkeypatch.delenv("S2_ENDPOINT", raising=False)
    cfg = S2Config.from_env()
    assert cfg.access_token == TOKEN
    assert cfg.account_base_url() == "https://acct.example/v1"
    assert cfg.basin_base_url("my-basin-1") == ("https://my-basin-1.basins.example/v1", False)
    # Overrides win over the environment; None means "not given".
    cfg2 = S2Config.from_env(access_token="other", account_endpoint=None, request_timeout=7.0)
    assert cfg2.access_token == "other"
    assert cfg2.account_endpoint == "https://acct.example"
    assert cfg2.request_timeout == 7.0
    with pytest.raises(TypeError, match="unknown setting"):
        S2Config.from_env(acess_token="typo")


def test_from_env_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("S2_ACCESS_TOKEN", "S2_ACCOUNT_ENDPOINT", "S2_BASIN_ENDPOINT", "S2_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    cfg = S2Config.from_env()
    assert cfg.access_token is None
    assert cfg.account_base_url() == "https://a.s2.dev/v1"
    assert cfg.basin_base_url("my-basin-1") == ("https://my-basin-1.b.s2.dev/v1", False)


def test_endpoints() -> None:
    lite = S2Config(endpoint="http://127.0.0.1:9/")
    assert lite.account_base_url() == "http://127.0.0.1:9/v1"
    assert lite.basin_base_url("my-basin-1") == ("http://127.0.0.1:9/v1", True)
    fixed = S2Config(basin_endpoint="https://basins.example/v1")
    assert fixed.basin_base_url("my-basin-1") == ("https://basins.example/v1", True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"endpoint": "ftp://x"}, "endpoint must be an http"),
        ({"connect_timeout": 0}, "connect_timeout"),
        ({"session_idle_timeout": -1}, "session_idle_timeout"),
        ({"access_token": "a\nb"}, "line breaks"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        S2Config(**kwargs)  # type: ignore[arg-type]


def test_retry_policy() -> None:
    p = RetryPolicy(max_attempts=3, initial_backoff=0.1, max_backoff=0.3)
    for attempt, base in [(0, 0.1), (1, 0.2), (2, 0.3), (10, 0.3)]:
        d = p.backoff(attempt)
        assert base <= d <= base * 1.5 + 1e-9
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="max_backoff"):
        RetryPolicy(initial_backoff=2, max_backoff=1)


def test_append_record_commands_and_metering() -> None:
    r = AppendRecord(b"abc", [(b"k", b"vv")], 5)
    assert r.metered_bytes == 8 + 2 + 1 + 2 + 3
    assert AppendRecord("text").body == b"text"
    fence = AppendRecord.fence("tok")
    assert fence.headers == ((b"", b"fence"),) and fence.body == b"tok" and fence.is_command
    trim = AppendRecord.trim(258)
    assert trim.headers == ((b"", b"trim"),) and trim.body == (258).to_bytes(8, "big")
    with pytest.raises(ValueError, match="36"):
        AppendRecord.fence("x" * 37)
    with pytest.raises(ValueError, match="u64"):
        AppendRecord.trim(-1)
    with pytest.raises(ValueError, match="timestamp"):
        AppendRecord(b"", timestamp=-1)
    with pytest.raises(TypeError, match="body"):
        AppendRecord(123)  # type: ignore[arg-type]


def test_stream_config_json_round_trip() -> None:
    cfg = StreamConfig(
        storage_class="express",
        retention_age=3600,
        timestamping_mode="arrival",
        delete_on_empty_min_age=60,
    )
    js = cfg.to_json()
    assert js == {
        "storage_class": "express",
        "retention_policy": {"age": 3600},
        "timestamping": {"mode": "arrival"},
        "delete_on_empty": {"min_age_secs": 60},
    }
    assert StreamConfig.from_json(js) == cfg
    assert StreamConfig(infinite_retention=True).to_json() == {"retention_policy": {"infinite": {}}}
    with pytest.raises(ValueError, match="storage_class"):
        StreamConfig(storage_class="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        StreamConfig(retention_age=1, infinite_retention=True)


def test_read_limits_validation() -> None:
    assert ReadLimits(count=5).count == 5
    with pytest.raises(ValueError, match="count"):
        ReadLimits(count=-1)


def test_bad_names_fail_before_any_request() -> None:
    with S2Client(S2Config(endpoint="http://127.0.0.1:9")) as client:
        with pytest.raises(BadRequestError, match="invalid basin name"):
            client.basin("Bad_Basin")
        with pytest.raises(BadRequestError, match="invalid stream name"):
            client.basin("good-basin").stream("")
        stream = client.basin("good-basin").stream("s")
        with pytest.raises(BadRequestError, match="at most one start"):
            stream.read(seq_num=1, timestamp=2)
        with pytest.raises(BadRequestError, match="count"):
            stream.read_session(count=-5)
        with pytest.raises(BadRequestError, match="wait"):
            stream.read_session(wait=float("nan"))


def test_clients_pickle_for_spark_executors() -> None:
    import pickle

    cfg = S2Config(access_token=TOKEN, endpoint="http://127.0.0.1:9")
    with S2Client(cfg) as client:
        stream = client.basin("good-basin").stream("events")
        for obj in (cfg, client, stream):
            copy = pickle.loads(pickle.dumps(obj))
            assert repr(copy) == repr(obj)
        copy = pickle.loads(pickle.dumps(stream))
        assert copy._t is not stream._t and copy._t.config == cfg
        copy._t.close()
