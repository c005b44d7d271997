"""Encrypted S2 streams through Spark: read and written by real queries with real
checkpoints, a wrong or missing key failing clearly, and the key found nowhere Spark or
the connector leaves text: checkpoint files, logs, progress, plans, the UI, the event
log, error messages.

The first test runs its queries in a child process with its own SparkSession (event log
and UI on, Spark's log at INFO, s2_spark's at DEBUG in every Python process), so that
everything the JVM and every Python worker print can be captured and searched.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _records import Rec, data_records

from s2_spark.s2 import AppendRecord, S2Client, S2Config

pytestmark = pytest.mark.spark

T0 = (int(time.time()) - 3600) * 1000


def new_key() -> tuple[str, bytes]:
    raw = os.urandom(32)
    return base64.b64encode(raw).decode(), raw


def leaks(key: str, raw: bytes) -> list[bytes]:
    """Every form of a key worth searching for."""
    return [key.encode(), key.rstrip("=").encode(), raw, raw.hex().encode(),
            base64.urlsafe_b64encode(raw).rstrip(b"=")]


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    return sorted(str(p) for p in root.rglob("*")
                  if p.is_file() and any(n in p.read_bytes() for n in needles))


def src_record(i: int) -> AppendRecord:
    return AppendRecord(f"event-{i}".encode(), [(b"i", str(i).encode())], T0 + i)


def records_of(client: S2Client, basin: str, stream: str) -> list[Rec]:
    """Every data record of a stream, read with the client's key."""
    return data_records(client.basin(basin).stream(stream))


CHILD = textwrap.dedent('''
    import json, os, sys, urllib.request
    from pathlib import Path
    from pyspark.sql import SparkSession
    from s2_spark.s2 import AppendRecord, S2Client, S2Config

    url, basin, work, key_file, wrong = sys.argv[1:6]
    work = Path(work)
    key = Path(key_file).read_text().strip()
    os.environ["S2_ENCRYPTION_KEY"] = key   # for the batch read: inherited by the JVM
    spark = (SparkSession.builder.master("local[2]").appName("s2-encryption")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.eventLog.enabled", "true")
             .config("spark.eventLog.dir", str(work / "events"))
             .config("spark.eventLog.compress", "false")
             .config("spark.ui.enabled", "true").config("spark.ui.port", "0")
             .getOrCreate())
    spark.sparkContext.setLogLevel("INFO")
    out = open(work / "child-output.txt", "w")
    def note(label, value):
        out.write(f"== {label}\\n{value}\\n")
        out.flush()

    base = {"endpoint": url, "basin": basin}
    ckpt = str(work / "checkpoint")
    def copy():
        """src -> dst: the reader has the key as an option, the writer from a file."""
        q = (spark.readStream.format("s2").options(**base, stream="src", encryptionKey=key)
             .load().writeStream.format("s2")
             .options(**base, stream="dst", encryptionKeyFile=key_file)
             .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        assert q.awaitTermination(180), "copy did not finish"
        assert q.exception() is None, q.exception()
        note("progress", json.dumps(q.recentProgress, default=str))
        note("explain", q._jsq.explainInternal(True))
        return q

    copy()
    with S2Client(S2Config(endpoint=url, encryption_key=key)) as client:
        client.basin(basin).stream("src").append_many(
            [AppendRecord(f"event-{i}".encode(), [(b"i", str(i).encode())], int(sys.argv[6]) + i)
             for i in range(30, 50)])
    copy()   # restarted from the checkpoint: only the new records

    rows = spark.read.format("s2").options(**base, stream="dst").load()  # key from the env
    note("batch explain", rows._jdf.queryExecution().toString())
    print("DST " + json.dumps([r.body.decode() for r in rows.orderBy("seq_num").collect()]))

    q = (spark.readStream.format("s2").options(**base, stream="src", encryptionKey=wrong)
         .load().writeStream.format("noop").option("checkpointLocation", str(work / "wrong"))
         .start())
    try:
        q.awaitTermination(180)
        raise SystemExit("the query with the wrong key did not fail")
    except Exception as e:
        note("wrong key error", str(e))
        print("WRONG " + json.dumps(str(e)))

    app = spark.sparkContext.applicationId
    ui = spark.sparkContext.uiWebUrl
    for page in (f"/api/v1/applications/{app}/sql?details=true&planDescription=true",
                 f"/api/v1/applications/{app}/environment", f"/api/v1/applications/{app}/jobs",
                 f"/api/v1/applications/{app}/stages?details=true", "/StreamingQuery/",
                 "/SQL/", "/environment/"):
        note("ui " + page, urllib.request.urlopen(ui + page, timeout=30).read().decode())
    spark.stop()
    print("DONE")
''')

#: Every Python process of the child (driver, Spark's Python workers) logs s2_spark at
#: DEBUG to its stderr, which the child's capture holds.
SITECUSTOMIZE = textwrap.dedent('''
    import logging, sys
    _h = logging.StreamHandler(sys.stderr)
    _h.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    _log = logging.getLogger("s2_spark")
    _log.addHandler(_h)
    _log.setLevel(logging.DEBUG)
''')


@pytest.mark.timeout(600)  # a SparkSession of its own and five queries, on a shared machine
def test_encrypted_streams_through_spark_leave_no_key_behind(
    s2_server: Any, tmp_path: Path
) -> None:
    key, raw = new_key()
    wrong, wrong_raw = new_key()
    key_file = tmp_path / "s2.key"
    key_file.write_text(key + "\n")
    basin = f"spark-enc-{uuid.uuid4().hex[:10]}"
    with S2Client(S2Config(endpoint=s2_server.url, encryption_key=key)) as client:
        client.create_basin(basin, {"stream_cipher": "aegis-256"})
        client.basin(basin).create_stream("src")
        client.basin(basin).create_stream("dst")
        client.basin(basin).stream("src").append_many([src_record(i) for i in range(30)])

        work = tmp_path / "work"
        (work / "events").mkdir(parents=True)
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        (tmp_path / "child.py").write_text(CHILD)
        env = {k: v for k, v in os.environ.items() if k != "S2_ENCRYPTION_KEY"}
        env["PYTHONPATH"] = str(tmp_path / "site")
        with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
            done = subprocess.run(
                [sys.executable, str(tmp_path / "child.py"), s2_server.url, basin, str(work),
                 str(key_file), wrong, str(T0)],
                stdout=out, stderr=err, env=env, timeout=420, check=False)
        stdout = (work / "stdout.txt").read_text()
        assert done.returncode == 0, (stdout[-3000:], (work / "stderr.txt").read_text()[-5000:])
        assert stdout.splitlines()[-1] == "DONE"

        # Exactly the source's records, copied once each across the restart.
        expected = [(f"event-{i}".encode(), [(b"i", str(i).encode())], T0 + i) for i in range(50)]
        assert records_of(client, basin, "src") == expected
        assert records_of(client, basin, "dst") == expected
        dst_line = next(x for x in stdout.splitlines() if x.startswith("DST "))
        assert json.loads(dst_line[4:]) == [f"event-{i}" for i in range(50)]

    # The wrong key: the query fails naming the stream and saying the key is wrong.
    wrong_line = next(x for x in stdout.splitlines() if x.startswith("WRONG "))
    text = json.loads(wrong_line[6:])
    assert f"records of stream 'src' in basin '{basin}' could not be decrypted" in text
    assert "the key is wrong" in text and "EncryptionKeyError" in text

    # Spark's logs at INFO and s2_spark's at DEBUG were captured (so the search below
    # searched something), and no form of either key is in any file the run left.
    logs = (work / "stderr.txt").read_text()
    assert "MicroBatchExecution" in logs and "s2_spark" in logs
    output = (work / "child-output.txt").read_text()
    assert '"numInputRows": 30' in output and '"numInputRows": 20' in output
    assert "== ui /StreamingQuery/" in output
    assert list((work / "checkpoint").rglob("offsets/*")), "no checkpoint was written"
    assert any((work / "events").rglob("*")), "no event log was written"
    assert files_holding(work, leaks(key, raw) + leaks(wrong, wrong_raw)) == []


# -- in the shared session ------------------------------------------------------------------


class Env:
    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.key, self.raw = new_key()
        self.client = S2Client(S2Config(endpoint=url, encryption_key=self.key))
        self.basin = f"spark-enc-{uuid.uuid4().hex[:10]}"
        self.client.create_basin(self.basin, {"stream_cipher": "aes-256-gcm"})

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url, "basin": self.basin, **extra}


@pytest.fixture(scope="module")
def env(target_s2: Any, spark: Any) -> Iterator[Env]:
    e = Env(target_s2.url, spark)
    yield e
    e.client.close()


def test_batch_write_and_read_with_a_key_file(env: Env, tmp_path: Path) -> None:
    env.client.basin(env.basin).create_stream("batch")
    key_file = tmp_path / "key"
    key_file.write_text(f"  {env.key}\n")
    df = env.spark.createDataFrame([(f"b{i}",) for i in range(5)], "body string").coalesce(1)
    df.write.format("s2").options(**env.options(stream="batch"),
                                  encryptionKeyFile=str(key_file)).mode("append").save()
    assert [b for b, _, _ in records_of(env.client, env.basin, "batch")] == [
        f"b{i}".encode() for i in range(5)]
    rows = (env.spark.read.format("s2").options(**env.options(stream="batch"),
                                                encryptionKey=env.key).load()
            .orderBy("seq_num").collect())
    assert [bytes(r.body) for r in rows] == [f"b{i}".encode() for i in range(5)]


def test_a_streaming_read_without_the_key_fails_clearly(env: Env, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    env.client.basin(env.basin).create_stream("nokey")
    env.client.basin(env.basin).stream("nokey").append([AppendRecord(b"x")])
    q = (env.spark.readStream.format("s2").options(**env.options(stream="nokey")).load()
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c"))
         .start())
    with pytest.raises(StreamingQueryException) as info:
        q.awaitTermination(120)
    text = str(info.value)
    assert f"stream 'nokey' in basin '{env.basin}' is encrypted" in text
    assert "missing encryption key for stream cipher 'aes-256-gcm'" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"encryptionKey": "c2hvcnQ="},
         "option encryptionKey must be the base64 of exactly 32 bytes"),
        ({"encryptionKey": "K" * 44, "encryptionKeyFile": "/k"},
         "set option encryptionKey or encryptionKeyFile, not both"),
        ({"encryptionKeyFile": "/nonexistent/s2.key"},
         "option encryptionKeyFile='/nonexistent/s2.key': cannot read the key file on the "
         "driver (No such file or directory)"),
    ],
)
@pytest.mark.parametrize("role", ["read", "write"])
def test_a_bad_key_option_fails_before_any_work(
    env: Env, extra: dict[str, str], message: str, role: str
) -> None:
    opts = {**env.options(stream="never"), **extra}
    with pytest.raises(Exception, match="OptionError") as info:
        if role == "read":
            env.spark.read.format("s2").options(**opts).load()
        else:
            env.spark.createDataFrame([("x",)], "body string").write.format("s2").options(
                **opts).mode("append").save()
    assert message in str(info.value)
    assert "c2hvcnQ=" not in str(info.value) and "K" * 44 not in str(info.value)


def test_readers_and_writers_show_no_key(env: Env) -> None:
    """The objects Spark holds and ships (and may print) hide the key; only their pickled
    bytes carry it to the executors, as they carry the access token."""
    import pickle

    from pyspark.sql.types import BinaryType, StructField, StructType

    from s2_spark.spark import S2DataSource

    env.client.basin(env.basin).create_stream("shown")
    ds = S2DataSource({**env.options(stream="shown"), "encryptionKey": env.key})
    schema = ds.schema()
    body = StructType([StructField("body", BinaryType())])
    made = [ds.streamReader(schema), ds.reader(schema), ds.streamWriter(body, False),
            ds.writer(body, False)]
    for obj in made:
        assert "encryption_key='***'" in repr(obj)
        for leak in leaks(env.key, env.raw):
            assert leak.decode(errors="replace") not in repr(obj)
        assert env.key.encode() in pickle.dumps(obj)
