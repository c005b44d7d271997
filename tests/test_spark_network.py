"""Spark queries on networks as they are: real queries on local[2], every connection (the
driver's and the executors') through `TcpProxy`.

* A copy query whose connections are cut after a random number of bytes finishes in one
  run: no task failure, no restart, every record exactly once and in order (both formats).
  Its retries wait 10 ms doubling to 100 ms (`FAST_RETRIES`), not 0.1 s doubling to 5 s:
  a cut before any progress is a failure in a row, so waits grew to seconds.
* Pooled connections that died while idle between two micro-batches cost nothing: the
  query runs with retries off (`retryTimeoutMs=0`) and still goes on.
* TLS options: a private CA and a client certificate reach the executors; a wrong or
  missing CA fails naming the option, before any task where it can.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _versions import limit
from conftest import Certs

from s2_spark.durable import DurableStreamsClient, IdempotentProducer
from s2_spark.s2 import AppendRecord, S2Client, S2Config, TlsConfig
from s2_spark.spark._compat import HAS_ADMISSION_CONTROL
from s2_spark.testing import LocalS2Server, ServerTls, TcpProxy

pytestmark = pytest.mark.spark


FAST_RETRIES = {"retryBackoffMs": "10", "retryMaxBackoffMs": "100"}


def body(i: int) -> bytes:
    return f"{i:08d}".encode().ljust(100, b".")


def failed_tasks(spark: Any, run_id: Any) -> int:
    """Failed task attempts of a query run's jobs (a streaming query's job group is its
    run id)."""
    tracker = spark.sparkContext.statusTracker()
    total = 0
    for job in tracker.getJobIdsForGroup(str(run_id)):
        info = tracker.getJobInfo(job)
        for stage in info.stageIds if info is not None else []:
            stage_info = tracker.getStageInfo(stage)
            total += stage_info.numFailedTasks if stage_info is not None else 0
    return total


class S2Pair:
    """A basin on the local server with streams `src` and `dst`, read back directly."""

    def __init__(self, url: str, basin: str) -> None:
        self.client = S2Client(S2Config(endpoint=url))
        self.basin = basin
        self.client.create_basin(basin)
        for name in ("src", "dst"):
            self.client.basin(basin).create_stream(name)

    def append(self, start: int, n: int) -> None:
        self.client.basin(self.basin).stream("src").append_many(
            AppendRecord(body(i)) for i in range(start, start + n))

    def copied(self) -> list[bytes]:
        s = self.client.basin(self.basin).stream("dst")
        tail = s.check_tail().seq_num
        if tail == 0:
            return []
        return [b for batch in s.read_session(seq_num=0, count=tail,
                                              include_command_records=False)
                for b in batch.batch.column("body").to_pylist()]


def s2_copy(spark: Any, options: dict[str, str], checkpoint: Path, *, available_now: bool,
            **read: str) -> Any:
    df = (spark.readStream.format("s2").options(**options).option("stream", "src")
          .options(**read).load())
    writer = (df.writeStream.format("s2").options(**options).option("stream", "dst")
              .option("checkpointLocation", str(checkpoint)))
    return (writer.trigger(availableNow=True) if available_now else writer).start()


@pytest.mark.parametrize("paced", [True, False], ids=["paced", "one-read"])
def test_s2_copy_over_a_cutting_network_finishes_in_one_run(
    spark: Any, s2_server: Any, unique: Callable[[str], str], tmp_path: Path, paced: bool
) -> None:
    """Paced (4.2+): micro-batches of 700 records, each read one frame. In one read (as
    every micro-batch is before 4.2): 3,000 records in frames of ~110 KB, more than a
    connection carries before it is cut, delivered as they arrive all the same."""
    read = limit(700) if paced else {}
    if paced and not read:
        pytest.skip("maxRecordsPerTrigger needs PySpark 4.2+: the one-read case covers it")
    pair = S2Pair(s2_server.url, unique("basin"))
    pair.append(0, 3000)
    with TcpProxy(s2_server.url, cut_after=(16 << 10, 160 << 10), seed=7) as proxy:
        options = {"endpoint": proxy.url, "basin": pair.basin, **FAST_RETRIES}
        q = s2_copy(spark, options, tmp_path / "ckpt", available_now=True, **read)
        q.awaitTermination()  # raises if the query failed
        assert failed_tasks(spark, q.runId) == 0
    assert proxy.cuts >= 3
    assert pair.copied() == [body(i) for i in range(3000)]


def test_durable_copy_over_a_cutting_network_finishes_in_one_run(
    spark: Any, ds_server: Any, unique: Callable[[str], str], tmp_path: Path
) -> None:
    src, dst = "/" + unique("src"), "/" + unique("dst")
    messages = [json.dumps({"i": i, "pad": "x" * 40}, separators=(",", ":")) for i in range(2000)]
    with DurableStreamsClient(base_url=ds_server.url) as direct:
        direct.stream(src).create("application/json")
        direct.stream(dst).create("application/json")
        with IdempotentProducer(direct.stream(src), "fill") as producer:
            for m in messages:
                producer.append_raw(m)
        # Each read answers with the whole backlog (~120 KB) on a connection of its own:
        # budgets below it cut the answer, the ones above let a retry through.
        with TcpProxy(ds_server.url, cut_after=(32 << 10, 160 << 10), seed=3) as proxy:
            df = (spark.readStream.format("durable-streams").option("baseUrl", proxy.url)
                  .option("stream", src).options(**limit(700), **FAST_RETRIES).load())
            q = (df.writeStream.format("durable-streams").option("baseUrl", proxy.url)
                 .option("stream", dst).options(**FAST_RETRIES)
                 .option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            assert failed_tasks(spark, q.runId) == 0
        # Paced (4.2+), the copy takes three micro-batches and its connections carry enough
        # to be cut; before 4.2 it is one micro-batch, one read and one write, that may
        # fit a connection's budget (each must: an answer is resent whole after a cut).
        assert proxy.cuts >= 1 or not HAS_ADMISSION_CONTROL
        copied = [v for c in direct.stream(dst).read("-1")
                  for v in c.batch().column("value").to_pylist()]
    assert copied == messages


def test_dead_pooled_connections_between_micro_batches_cost_no_retry(
    spark: Any, s2_server: Any, unique: Callable[[str], str], tmp_path: Path
) -> None:
    pair = S2Pair(s2_server.url, unique("basin"))
    pair.append(0, 100)
    with TcpProxy(s2_server.url) as proxy:
        # Retries off: a dead connection counted as a failure would fail the query.
        options = {"endpoint": proxy.url, "basin": pair.basin, "retryTimeoutMs": "0"}
        q = s2_copy(spark, options, tmp_path / "ckpt", available_now=False)
        try:
            q.processAllAvailable()
            for n in range(1, 4):
                assert proxy.poison_open() > 0  # every idle connection dies, unnoticed
                pair.append(100 * n, 100)
                q.processAllAvailable()
            assert q.exception() is None
        finally:
            q.stop()
    assert proxy.resets >= 3
    assert pair.copied() == [body(i) for i in range(400)]


def test_durable_reads_on_dead_pooled_connections_cost_no_retry(
    spark: Any, ds_server: Any, unique: Callable[[str], str]
) -> None:
    path = "/" + unique("ds")
    with DurableStreamsClient(base_url=ds_server.url) as direct, TcpProxy(ds_server.url) as proxy:
        s = direct.stream(path)
        s.create("application/json")
        s.append_json([{"i": i} for i in range(50)])
        df = (spark.readStream.format("durable-streams").option("baseUrl", proxy.url)
              .option("stream", path).option("retryTimeoutMs", "0").load())
        name = unique("sink").replace("-", "_")
        q = df.writeStream.format("memory").queryName(name).start()
        try:
            q.processAllAvailable()
            for n in range(1, 4):
                assert proxy.poison_open() > 0
                s.append_json([{"i": i} for i in range(50 * n, 50 * n + 50)])
                q.processAllAvailable()
            rows = spark.sql(f"select value from {name}").collect()
        finally:
            q.stop()
    assert sorted(json.loads(r.value)["i"] for r in rows) == list(range(200))
    assert proxy.resets >= 3


def test_tls_options_reach_the_executors(
    spark: Any, certs: Certs, unique: Callable[[str], str]
) -> None:
    mtls = ServerTls(certs.server_cert, certs.server_key, client_ca_file=certs.ca)
    basin = unique("basin")
    with LocalS2Server(tls=mtls) as server:
        client_tls = TlsConfig(ca_file=certs.ca, cert_file=certs.client)
        with S2Client(S2Config(endpoint=server.url, tls=client_tls)) as c:
            c.create_basin(basin)
        tls = {"endpoint": server.url, "basin": basin, "sslCaFile": certs.ca,
               "sslCertFile": certs.client, "createStreams": "true"}
        rows = [(body(i),) for i in range(500)]
        (spark.createDataFrame(rows, "body binary").coalesce(1).write.format("s2").options(**tls)
         .option("stream", "s").mode("append").save())
        read_options = {k: v for k, v in tls.items() if k != "createStreams"}
        df = spark.read.format("s2").options(**read_options).option("stream", "s").load()
        got = [(r.seq_num, r.body) for r in df.orderBy("seq_num").collect()]
    assert [b for _, b in got] == [body(i) for i in range(500)]


def test_a_missing_or_wrong_ca_fails_naming_the_option(
    spark: Any, certs: Certs, unique: Callable[[str], str]
) -> None:
    with LocalS2Server(tls=ServerTls(certs.server_cert, certs.server_key)) as server:
        base = {"endpoint": server.url, "basin": unique("basin"), "stream": "s"}
        for extra in ({}, {"sslCaFile": certs.other_ca}):
            with pytest.raises(Exception, match="sslCaFile") as e:
                spark.read.format("s2").options(**base, **extra).load().collect()
            assert "not trusted" in str(e.value)
        with pytest.raises(Exception, match=r"option sslCaFile: the CA bundle '/nope/ca\.pem'"):
            spark.read.format("s2").options(**base, sslCaFile="/nope/ca.pem").load()


def test_the_key_password_stays_out_of_checkpoints_and_plans(
    spark: Any, certs: Certs, unique: Callable[[str], str], tmp_path: Path
) -> None:
    secret = "pw-SECRET-5150"
    with LocalS2Server(tls=ServerTls(certs.server_cert, certs.server_key)) as server:
        basin = unique("basin")
        with S2Client(S2Config(endpoint=server.url, tls=TlsConfig(ca_file=certs.ca))) as c:
            c.create_basin(basin)
            c.basin(basin).create_stream("s")
            c.basin(basin).stream("s").append([AppendRecord(body(0))])
        options = {"endpoint": server.url, "basin": basin, "stream": "s",
                   "sslCaFile": certs.ca, "sslCertFile": certs.client, "sslKeyPassword": secret}
        df = spark.readStream.format("s2").options(**options).load()
        q = (df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        plan = spark.read.format("s2").options(**options).load()._jdf.queryExecution().toString()
    assert secret not in plan
    for f in (tmp_path / "c").rglob("*"):
        assert not f.is_file() or secret.encode() not in f.read_bytes(), f


@pytest.mark.parametrize("fmt", ["s2", "durable-streams"])
@pytest.mark.parametrize(("option", "value", "message"), [
    ("retryTimeoutMs", "-5", "option retryTimeoutMs='-5' is not accepted: use milliseconds"),
    ("retryTimeoutMs", "soon", "option retryTimeoutMs='soon' is not accepted"),
    ("retryBackoffMs", "0", r"option retryBackoffMs='0' is not accepted: use milliseconds, "
                            r"an integer >= 1 \(the wait before the first retry; default 100\)"),
    ("retryMaxBackoffMs", "1s", "option retryMaxBackoffMs='1s' is not accepted"),
    ("sslKeyFile", "/k.pem", "set option sslCertFile too"),
    ("sslCertFile", "/nope/c.pem", "client certificate '/nope/c.pem' could not be loaded"),
])
def test_bad_network_options_fail_at_load(
    spark: Any, fmt: str, option: str, value: str, message: str
) -> None:
    where = ({"endpoint": "http://127.0.0.1:9", "basin": "some-basin", "stream": "s"}
             if fmt == "s2" else {"url": "http://127.0.0.1:9/s"})
    with pytest.raises(Exception, match=message):
        spark.read.format(fmt).options(**where, **{option: value}).load()
