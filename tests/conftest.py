"""Shared fixtures: one local S2 server, one Durable Streams reference server and one
SparkSession per test session.

Spark workers run `sys.executable`, the interpreter that has s2_spark installed.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# The servers under test are on loopback: a proxy set in the machine's environment (the
# clients honour HTTP_PROXY / HTTPS_PROXY) must not stand in between. Spark's workers
# inherit this too.
for _name in ("NO_PROXY", "no_proxy"):
    os.environ[_name] = ",".join(filter(None, [os.environ.get(_name), "127.0.0.1", "localhost"]))


#: The longest test modules (minutes each: kills, clusters, Connect, pipelines), run first:
#: `-n 2 --dist loadfile` hands out modules in collection order, and one of these left for
#: last kept one worker busy minutes after the other ran out of work.
LONGEST_FIRST = (
    "test_spark_fanout.py", "test_deploy_cluster.py", "test_spark_many_streams.py",
    "test_deploy_pipelines.py", "test_deploy_connect.py", "test_spark_writer.py",
    "test_spark_writer_reorder.py",
    "test_durable_spark_writer.py", "test_spark_reader.py", "test_durable_spark_reader.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of `LONGEST_FIRST` first, in that order; the rest, and the tests within
    every module, keep their order."""
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def s2_server() -> Iterator[Any]:
    """An in-memory local S2 server on a free port, shared by the whole test session."""
    from s2_spark.testing import LocalS2Server

    with LocalS2Server(heartbeat_interval=0.5) as server:
        yield server


@pytest.fixture(scope="session")
def ds_server() -> Iterator[Any]:
    """The Durable Streams reference server, in memory, long-poll timeout 1 s, shared."""
    from durable_testbed import DurableServer

    with DurableServer(long_poll_timeout=1.0) as server:
        yield server


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Make names unique per test, so tests sharing a server never see each other's data."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def basin(s2_server: Any, unique: Callable[[str], str]) -> Iterator[Any]:
    """A new, empty basin on the shared local S2 server (its BasinClient); modules that
    need another kind of basin define their own `basin`."""
    from s2_spark.s2 import S2Client, S2Config

    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        name = unique("basin")
        client.create_basin(name)
        yield client.basin(name)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] SparkSession for every Spark test."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("s2-spark-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@dataclass(frozen=True)
class Certs:
    """PEM files made at test time: a CA, a server certificate it signed for 127.0.0.1 and
    localhost (`server_cert`, `server_key`), a client certificate it signed (`client`: key
    and chain in one file), and an unrelated CA."""

    ca: str
    server_cert: str
    server_key: str
    client: str
    other_ca: str


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    import trustme

    d = tmp_path_factory.mktemp("certs")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    other.cert_pem.write_to_path(str(d / "other-ca.pem"))
    for i, blob in enumerate(server.cert_chain_pems):
        blob.write_to_path(str(d / "server.pem"), append=i > 0)
    server.private_key_pem.write_to_path(str(d / "server.key"))
    ca.issue_cert("spark-client@example.com").private_key_and_cert_chain_pem.write_to_path(
        str(d / "client.pem"))
    return Certs(str(d / "ca.pem"), str(d / "server.pem"), str(d / "server.key"),
                 str(d / "client.pem"), str(d / "other-ca.pem"))
