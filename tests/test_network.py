"""Both clients on networks as they are: retries by deadline, answers cut short, pooled
connections that died while idle, private CAs, client certificates and HTTP proxies.

Real parts only: the local S2 server (also serving TLS with certificates made here), the
Durable Streams reference server, `TcpProxy` cutting or resetting connections, and an HTTP
proxy (`http_proxy.HttpProxy`) for CONNECT tunnels and plain forwarding.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Certs
from http_proxy import HttpProxy

from s2_spark.durable import DurableConfig, DurableStreamsClient, IdempotentProducer
from s2_spark.errors import OptionError, ServiceError, TlsError, UnavailableError
from s2_spark.retry import RetryLoop
from s2_spark.s2 import AppendRecord, RetryPolicy, S2Client, S2Config, TlsConfig
from s2_spark.testing import LocalS2Server, ServerTls, TcpProxy
from s2_spark.wire.records import decode_read_batch, read_batch_prefix

TOKEN = "tok-SECRET-network-77"
NO_RETRIES = RetryPolicy(timeout=0)


@pytest.fixture
def proxy_to(s2_server: Any) -> Iterator[Callable[..., TcpProxy]]:
    proxies: list[TcpProxy] = []

    def make(upstream: str | None = None, **kw: Any) -> TcpProxy:
        proxies.append(TcpProxy(upstream or s2_server.url, **kw))
        return proxies[-1]

    yield make
    for p in proxies:
        p.close()


def body(i: int) -> bytes:
    return f"{i:06d}".encode().ljust(100, b"~")


def s2_stream(url: str, basin: str, retry: RetryPolicy = NO_RETRIES, **kw: Any) -> Any:
    client = S2Client(S2Config(access_token=TOKEN, endpoint=url, retry=retry, **kw))
    return client, client.basin(basin).stream("s")


@pytest.fixture
def filled(s2_server: Any, unique: Callable[[str], str]) -> str:
    """A basin whose stream "s" holds 1000 records of 100 bytes."""
    basin = unique("basin")
    with S2Client(S2Config(access_token=TOKEN, endpoint=s2_server.url)) as c:
        c.create_basin(basin)
        c.basin(basin).create_stream("s")
        c.basin(basin).stream("s").append_many(AppendRecord(body(i)) for i in range(1000))
    return basin


# -- the retry loop ----------------------------------------------------------------------


def failure(*, stale: bool = False) -> UnavailableError:
    err = UnavailableError(f"GET of stream 's' failed in transit (token {TOKEN[:3]}...)")
    err.stale_connection = stale
    return err


def test_retries_off_fail_at_once_saying_so() -> None:
    loop = RetryLoop(NO_RETRIES, "GET stream 's'")
    with pytest.raises(UnavailableError, match="retries are off") as e:
        loop.failed(failure())
    assert e.value.attempts == 1


def test_the_budget_is_time_without_progress_and_progress_resets_it() -> None:
    policy = RetryPolicy(timeout=0.3, initial_backoff=0.01, max_backoff=0.02)
    loop = RetryLoop(policy, "read")
    for _ in range(5):  # a failure, then progress: never runs out however long it goes
        loop.failed(failure())
        loop.progressed()
    with pytest.raises(UnavailableError) as e:
        while True:
            loop.failed(failure())
    err = e.value
    assert err.attempts >= 3 and err.retried_for >= 0.3
    assert f"gave up after {err.attempts} attempts" in str(err)
    assert "retryTimeoutMs" in str(err) and TOKEN not in str(err)


@pytest.mark.parametrize(("given", "backoffs"), [
    ({}, (0.1, 5.0)),
    ({"retryBackoffMs": "20", "retryMaxBackoffMs": "300"}, (0.02, 0.3)),
    ({"retryBackoffMs": "8000"}, (8.0, 8.0)),  # the longest unset: the first's
])
def test_backoff_options_reach_both_formats_clients(
    given: dict[str, str], backoffs: tuple[float, float]
) -> None:
    from s2_spark.backends.durable.options import parse_durable_connection
    from s2_spark.backends.s2.options import parse_s2_connection

    s2 = parse_s2_connection({"endpoint": "http://127.0.0.1:9", "basin": "b", **given},
                             purpose="read from")
    durable = parse_durable_connection({"baseUrl": "http://127.0.0.1:9", **given})
    for policy in (s2.config().retry, durable.config().retry):
        assert (policy.initial_backoff, policy.max_backoff, policy.timeout) == (*backoffs, 120)


def test_a_longest_backoff_below_the_first_fails_naming_both() -> None:
    from s2_spark.backends.network_options import parse_network_options

    with pytest.raises(OptionError, match="option retryMaxBackoffMs=200 is below "
                                          "retryBackoffMs=300"):
        parse_network_options({"retryBackoffMs": "300", "retryMaxBackoffMs": "200"})


def test_dead_pooled_connections_are_retried_at_once_then_counted() -> None:
    loop = RetryLoop(NO_RETRIES, "read")
    for _ in range(17):  # every idle connection of the pool may be dead
        loop.failed(failure(stale=True))
    with pytest.raises(UnavailableError, match="retries are off"):
        loop.failed(failure(stale=True))


def test_a_down_server_is_retried_until_the_timeout(unique: Callable[[str], str]) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    retry = RetryPolicy(timeout=0.5, initial_backoff=0.02, max_backoff=0.05)
    client, s = s2_stream(f"http://127.0.0.1:{port}", unique("basin"), retry)
    with client, pytest.raises(UnavailableError) as e:
        s.check_tail()
    err = e.value
    assert err.attempts > 2 and err.retried_for >= 0.5
    assert "connect" in str(err).lower() and "gave up after" in str(err)
    assert TOKEN not in str(err) + repr(err.__cause__)


# -- answers cut short ---------------------------------------------------------------------


def test_read_batch_prefix_keeps_exactly_the_whole_records() -> None:
    from s2_spark._proto import s2_pb2

    msg = s2_pb2.ReadBatch()
    for i in range(50):
        r = msg.records.add(seq_num=i, timestamp=i, body=body(i))
        r.headers.add(name=b"k", value=b"v" * (i % 7))
    msg.tail.seq_num = 50
    data = msg.SerializeToString()
    seen = set()
    for cut in range(len(data) + 1):
        kept = read_batch_prefix(data[:cut])
        n = 0 if kept is None else decode_read_batch(kept, "s").count
        seen.add(n)
        if kept is not None:
            batch = decode_read_batch(kept, "s").batch
            assert batch.column("seq_num").to_pylist() == list(range(n))
            assert batch.column("body").to_pylist() == [body(i) for i in range(n)]
    assert seen == set(range(51))


def test_a_unary_read_cut_short_returns_the_records_that_arrived(
    proxy_to: Callable[..., TcpProxy], filled: str
) -> None:
    proxy = proxy_to(cut_after=(30_000, 30_000))  # each answer is cut after ~30 KB
    client, s = s2_stream(proxy.url, filled)  # no retries: only salvage can succeed
    got: list[int] = []
    bodies: list[bytes] = []
    with client:
        while len(got) < 1000:
            decoded = s.read(seq_num=len(got), count=1000 - len(got))
            assert 0 < decoded.count < 1000
            got += decoded.batch.column("seq_num").to_pylist()
            bodies += decoded.batch.column("body").to_pylist()
    assert got == list(range(1000)) and bodies == [body(i) for i in range(1000)]
    assert proxy.cuts >= 3


def test_a_read_session_cut_every_few_frames_finishes(
    proxy_to: Callable[..., TcpProxy], filled: str
) -> None:
    with S2Client(S2Config(endpoint=proxy_to().url)) as c:  # 6000 records of 10 bytes
        c.basin(filled).create_stream("small")
        c.basin(filled).stream("small").append_many(
            AppendRecord(b"%010d" % i) for i in range(6000))
    proxy = proxy_to(cut_after=(40_000, 60_000))  # frames of 1000 records are ~20 KB
    # At most 2 failures in a row, yet many cuts: every resumed session delivers something.
    retry = RetryPolicy(max_attempts=3, initial_backoff=0.01)
    with S2Client(S2Config(endpoint=proxy.url, retry=retry)) as c:
        session = c.basin(filled).stream("small").read_session(seq_num=0, count=6000)
        got = [n for b in session for n in b.batch.column("body").to_pylist()]
    assert got == [b"%010d" % i for i in range(6000)]
    assert proxy.cuts >= 3 and session.reconnects >= 3


def test_a_read_session_holding_frames_for_its_batches_loses_none_to_cuts(
    proxy_to: Callable[..., TcpProxy], filled: str
) -> None:
    """With `batch_bytes`, frames held for a batch when the connection is cut are whole:
    they are delivered before resuming, so a read whose batches are larger than any
    connection carries still finishes, every record exactly once. (They were once
    dropped and read again, and such a read never finished: each attempt received a
    frame, which counted as progress, and lost it to the next cut.)"""
    with S2Client(S2Config(endpoint=proxy_to().url)) as c:
        c.basin(filled).create_stream("held")
        c.basin(filled).stream("held").append_many(
            AppendRecord(b"%010d" % i) for i in range(6000))
    proxy = proxy_to(cut_after=(40_000, 60_000))  # frames of 1000 records are ~20 KB
    # At most 2 failures in a row: every cut connection delivers what it carried.
    retry = RetryPolicy(max_attempts=3, initial_backoff=0.01)
    with S2Client(S2Config(endpoint=proxy.url, retry=retry)) as c:
        session = c.basin(filled).stream("held").read_session(
            seq_num=0, count=6000, batch_bytes=1 << 20)  # a batch more than any connection
        batches = list(session)
    assert [n for b in batches for n in b.batch.column("body").to_pylist()] == [
        b"%010d" % i for i in range(6000)]
    assert all(b.count % 1000 == 0 for b in batches)  # whole frames, none split or lost
    assert len(batches) >= 3 and proxy.cuts >= 2 and session.reconnects >= 2


# -- pooled connections that died while idle ------------------------------------------------


def test_s2_calls_on_dead_pooled_connections_succeed_without_retries(
    proxy_to: Callable[..., TcpProxy], filled: str
) -> None:
    proxy = proxy_to()
    client, s = s2_stream(proxy.url, filled)
    with client:
        for i in range(3):
            assert s.check_tail().seq_num == 1000 + i
            assert s.read(seq_num=999).count == 1 + i
            s.fence(f"f{i}")  # a command record: retried like a read
            proxy.poison_open()  # every pooled connection is now dead
    assert proxy.resets >= 2  # the first call after each poisoning met a dead connection


def test_durable_calls_on_dead_pooled_connections_succeed_without_retries(
    ds_server: Any, proxy_to: Callable[..., TcpProxy], unique: Callable[[str], str]
) -> None:
    proxy = proxy_to(ds_server.url)
    config = DurableConfig(base_url=proxy.url, retry=NO_RETRIES)
    with DurableStreamsClient(config) as client:
        s = client.stream("/" + unique("ds"))
        s.create("application/json")
        producer = IdempotentProducer(s, "p", max_in_flight=1)
        for i in range(3):
            producer.append({"i": i})
            producer.flush()
            proxy.poison_open()
            assert s.head().next_offset
            proxy.poison_open()
        assert [m["i"] for c in s.read("-1") for m in c.messages()] == [0, 1, 2]
    assert proxy.resets >= 5  # the first call after each poisoning met a dead connection


# -- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(certs: Certs) -> Iterator[LocalS2Server]:
    with LocalS2Server(tls=ServerTls(certs.server_cert, certs.server_key)) as server:
        yield server


def round_trip(url: str, basin: str, tls: TlsConfig | None, **kw: Any) -> list[bytes]:
    """Appends, a read session, a unary read and a tail lookup on the fan-out; then the
    tail watch's long-polls (over HTTP/2, chosen by ALPN over TLS) see the stream quiet,
    and see a record appended to it."""
    with S2Client(S2Config(endpoint=url, tls=tls, **kw)) as c:
        c.ensure_basin(basin)
        c.basin(basin).ensure_stream("s")
        s = c.basin(basin).stream("s")
        s.append_many([AppendRecord(body(i)) for i in range(1500)], match_seq_num=0)
        out = [b for x in s.read_session(seq_num=0, count=1500)
               for b in x.batch.column("body").to_pylist()]
        assert s.read(seq_num=0, count=10).count == 10
        assert c.basin(basin).check_tails(["s"])["s"].seq_num == 1500  # the fan-out
        assert watched_news(c.basin(basin), s, 1500) == {"h2": 1, "http/1.1": 0}
        return out


def watched_news(basin: Any, stream: Any, tail: int) -> dict[str, int]:
    """The watch sees `stream` quiet at `tail`, then a record appended to it; the
    connections it polled over, by protocol."""
    with basin.watch_tails(wait=2, own_connections=0) as watch:
        watch.watch({"s": tail})
        deadline = time.monotonic() + 20
        while watch.quiet({"s": tail}) != {"s"}:
            assert time.monotonic() < deadline, "the watch never polled"
            time.sleep(0.02)
        stream.append([AppendRecord(b"news")])
        watch.wait({"s"}, timeout=20)
        assert watch.quiet({"s": tail}) == set()
        return watch.connections()


def test_a_private_ca_is_trusted_through_the_ca_option(
    tls_server: LocalS2Server, certs: Certs, unique: Callable[[str], str]
) -> None:
    got = round_trip(tls_server.url, unique("basin"), TlsConfig(ca_file=certs.ca))
    assert got == [body(i) for i in range(1500)]


@pytest.mark.parametrize("ca", [None, "other"])
def test_an_untrusted_certificate_is_a_tls_error_naming_the_option(
    tls_server: LocalS2Server, certs: Certs, ca: str | None
) -> None:
    tls = None if ca is None else TlsConfig(ca_file=certs.other_ca)
    config = S2Config(access_token=TOKEN, endpoint=tls_server.url, tls=tls)
    with S2Client(config) as c, pytest.raises(TlsError) as e:
        c.basin("some-basin").stream("s").check_tail()
    text = str(e.value)
    assert "not trusted" in text and "sslCaFile" in text and "SSL_CERT_FILE" in text
    assert not e.value.retryable and e.value.attempts == 1 and TOKEN not in text


def test_a_read_session_with_an_untrusted_certificate_is_a_tls_error(
    tls_server: LocalS2Server,
) -> None:
    config = S2Config(access_token=TOKEN, endpoint=tls_server.url)
    with S2Client(config) as c, pytest.raises(TlsError) as e:
        list(c.basin("some-basin").stream("s").read_session(seq_num=0, count=5000))
    assert "not trusted" in str(e.value) and not e.value.retryable


def test_a_client_certificate_is_presented_where_the_server_requires_one(
    certs: Certs, unique: Callable[[str], str]
) -> None:
    mtls = ServerTls(certs.server_cert, certs.server_key, client_ca_file=certs.ca)
    with LocalS2Server(tls=mtls) as server:
        tls = TlsConfig(ca_file=certs.ca, cert_file=certs.client)
        assert round_trip(server.url, unique("basin"), tls) == [body(i) for i in range(1500)]
        with S2Client(S2Config(endpoint=server.url, tls=TlsConfig(ca_file=certs.ca),
                               retry=NO_RETRIES)) as c, pytest.raises(ServiceError):
            list(c.list_basins())


def test_an_encrypted_client_key_needs_its_password(certs: Certs, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    pem = Path(certs.client).read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw-SECRET-1"))
    key_file = tmp_path / "client.key"
    key_file.write_bytes(encrypted)
    good = TlsConfig(cert_file=certs.client, key_file=str(key_file), key_password="pw-SECRET-1")
    good.ssl_context()
    for password in (None, "wrong-SECRET"):
        tls = TlsConfig(cert_file=certs.client, key_file=str(key_file), key_password=password)
        with pytest.raises(ValueError, match="could not be loaded") as e:
            tls.ssl_context()  # fails, instead of prompting on a terminal
        assert "SECRET" not in str(e.value) + repr(tls)


def test_unreadable_tls_files_are_named() -> None:
    with pytest.raises(ValueError, match=r"CA bundle '/nope/ca\.pem' could not be loaded"):
        TlsConfig(ca_file="/nope/ca.pem").ssl_context()
    with pytest.raises(ValueError, match=r"client certificate '/nope/c\.pem'"):
        TlsConfig(cert_file="/nope/c.pem").ssl_context()
    with pytest.raises(ValueError, match="need cert_file"):
        TlsConfig(key_file="k.pem")
    assert "hunter2" not in repr(TlsConfig(cert_file="c", key_password="hunter2"))


# -- proxies from the environment ----------------------------------------------------------


@pytest.fixture
def http_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpProxy]:
    proxy = HttpProxy()
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    yield proxy
    proxy.close()


def test_s2_over_tls_through_a_connect_proxy(
    http_proxy: HttpProxy, tls_server: LocalS2Server, certs: Certs, unique: Callable[[str], str]
) -> None:
    url = f"https://localhost:{tls_server.port}"
    got = round_trip(url, unique("basin"), TlsConfig(ca_file=certs.ca))
    assert got == [body(i) for i in range(1500)]
    assert f"CONNECT localhost:{tls_server.port} HTTP/1.1" in http_proxy.request_lines


def test_durable_streams_through_a_forwarding_proxy(
    http_proxy: HttpProxy, ds_server: Any, unique: Callable[[str], str]
) -> None:
    path = "/" + unique("ds")
    with DurableStreamsClient(DurableConfig(base_url=ds_server.url)) as client:
        s = client.stream(path)
        s.create("application/json")
        s.append_json([{"n": 1}, {"n": 2}])
        assert [m for c in s.read("-1") for m in c.messages()] == [{"n": 1}, {"n": 2}]
    lines = http_proxy.request_lines
    assert f"PUT {ds_server.url}{path} HTTP/1.1" in lines
    assert any(line.startswith(f"GET {ds_server.url}{path}?offset=-1") for line in lines)


def test_the_tail_watch_goes_through_a_forwarding_proxy(
    http_proxy: HttpProxy, s2_server: Any, filled: str
) -> None:
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        before = len(http_proxy.request_lines)
        used = watched_news(client.basin(filled), client.basin(filled).stream("s"), 1000)
    assert used == {"h2": 0, "http/1.1": 1}  # a forwarding proxy: HTTP/1.1
    polls = [line for line in http_proxy.request_lines[before:]
             if line.startswith(f"GET {s2_server.url}/v1/streams/s/records?seq_num=1000")]
    assert polls  # absolute-form long-polls, forwarded


def test_no_proxy_is_honoured(
    http_proxy: HttpProxy, s2_server: Any, filled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = len(http_proxy.request_lines)  # `filled` went through the proxy
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    client, s = s2_stream(s2_server.url, filled)
    with client:
        assert s.check_tail().seq_num == 1000
    assert len(http_proxy.request_lines) == before



def test_finished_append_sessions_leave_their_connection_to_the_next(
    filled: str, proxy_to: Callable[..., TcpProxy]
) -> None:
    """A session whose every input was acknowledged is read to its end, so the next
    request (a session or a unary call) reuses the connection instead of opening one."""
    from s2_spark.wire.appends import encode_records

    proxy = proxy_to()
    client, stream = s2_stream(proxy.url, filled)
    with client:
        for i in range(5):
            batches = encode_records([AppendRecord(body(2000 + i))])
            result = stream.append_chain(batches, fencing_tokens=[None])
            assert result.error is None and len(result.acks) == 1
        assert stream.check_tail().seq_num == 1005
    assert proxy.connections == 1


def test_a_delay_proxy_forwards_every_byte_in_order(
    s2_server: Any, filled: str
) -> None:
    """`DelayProxy` (the benchmarks' far-away service) holds bytes, never changes them: a
    read session and a thousand appends through it are exact."""
    from s2_spark.testing import DelayProxy

    with DelayProxy(s2_server.url, rtt_ms=2) as proxy:
        client, stream = s2_stream(proxy.url, filled)
        with client:
            got = [b for x in stream.read_session(seq_num=0, count=1000)
                   for b in x.batch.column("body").to_pylist()]
            stream.append_many([AppendRecord(body(1000 + i)) for i in range(1000)],
                               match_seq_num=1000)
            assert stream.check_tail().seq_num == 2000
        assert proxy.connections >= 1
    assert got == [body(i) for i in range(1000)]
