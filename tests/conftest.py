"""Shared fixtures: the S2 servers (one s2-lite and one local server, each started when a
test first needs it), one Durable Streams reference server and one SparkSession per test
session (per pytest worker).

`s2_server` is the S2 a test talks to: s2-lite (or the local server with
`S2_TEST_SERVER=local`, or the S2 of `S2_TEST_ENDPOINT`; see `_s2_target`), and the local
server for tests marked `local_server`. Each test runs once. Spark workers run
`sys.executable`, the interpreter that has s2_spark installed; with an endpoint, Spark's S2
source and sink find its token in S2_ACCESS_TOKEN.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _class_archive import (
    LIGHT_JVM,
    archive_path,
    await_archive,
    conf_dir,
    start_archive,
    use_archive,
)
from _s2_target import (
    ENDPOINT,
    EXTERNAL,
    LITE,
    TOKEN,
    ExternalS2,
    made_here,
    s2_config,
    unique_name,
)
from _spark_site import compile_tree, with_spark_site

os.environ["PYSPARK_PYTHON"] = sys.executable
if EXTERNAL and TOKEN is not None:
    # The S2 options' fallback for accessToken, on Spark's driver.
    os.environ["S2_ACCESS_TOKEN"] = TOKEN
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# The servers under test are on loopback: a proxy set in the machine's environment (the
# clients honour HTTP_PROXY / HTTPS_PROXY) must not stand in between. Spark's workers
# inherit this too.
for _name in ("NO_PROXY", "no_proxy"):
    os.environ[_name] = ",".join(filter(None, [os.environ.get(_name), "127.0.0.1", "localhost"]))
# Spark's Python processes import pyspark compiled, not from its zip (_spark_site); they
# inherit PYTHONPATH from the JVM.
if (_python_path := with_spark_site(os.environ.get("PYTHONPATH"))) is not None:
    os.environ["PYTHONPATH"] = _python_path
# Every JVM the tests start (the session's, child queries', clusters', Connect's).
os.environ.setdefault("JAVA_TOOL_OPTIONS", LIGHT_JVM)
#: Spark's classes archived once (`_class_archive`): a driver started after it is there
#: spends half the CPU starting.
CLASS_ARCHIVE = archive_path()
if CLASS_ARCHIVE is not None:  # every Spark JVM's, the archive's class path begins with it
    os.environ.setdefault("SPARK_CONF_DIR", str(conf_dir(CLASS_ARCHIVE)))


def pytest_configure(config: pytest.Config) -> None:
    """Our modules' bytecode, and the class archive: made where it is missing, waited for
    (up to 3 minutes) where a maker is at work, so that the workers' session drivers start
    with it (once: the xdist controller, or the only process)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    compile_tree()
    if CLASS_ARCHIVE is not None:
        await_archive(CLASS_ARCHIVE, start_archive(CLASS_ARCHIVE))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Drivers this test starts use the class archive if it is there by now."""
    if CLASS_ARCHIVE is not None:
        use_archive(CLASS_ARCHIVE)


#: The longest test modules (minutes each: kills, clusters, Connect, pipelines), run first:
#: `-n 2 --dist loadfile --no-loadscope-reorder` hands out modules in collection order
#: (without the flag, xdist >= 3.7 orders them by their number of tests, which puts these,
#: few tests each, last), and one of these left for last kept one worker busy minutes
#: after the other ran out of work.
LONGEST_FIRST = (
    "test_spark_fanout.py", "test_deploy_cluster.py", "test_spark_many_streams.py",
    "test_deploy_pipelines.py", "test_deploy_connect.py", "test_spark_writer.py",
    "test_spark_writer_reorder.py", "test_benchmarks_smoke.py",
    "test_durable_spark_writer.py", "test_spark_reader.py", "test_durable_spark_reader.py",
    "test_spark_encryption.py", "test_durable_example.py", "test_s2_lite_pipelines.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules of `LONGEST_FIRST` first, in that order; the rest, and the tests within
    every module, keep their order. A `local_server` test must not use a fixture built on
    `target_s2` (a module's shared one, say): it would meet s2-lite, not the local server.
    Against `S2_TEST_ENDPOINT` only the tests that meet it run (the others are deselected,
    and `local_server` ones skip): that run proves the connector against another S2."""
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    for item in items:
        if (item.get_closest_marker("local_server") is not None
                and "target_s2" in getattr(item, "fixturenames", ())):
            raise pytest.UsageError(
                f"{item.nodeid} is marked local_server but uses target_s2, the suite's S2")
    if ENDPOINT is None:
        return
    facing = [item for item in items
              if {"s2_server", "target_s2"} & set(getattr(item, "fixturenames", ()))]
    config.hook.pytest_deselected(items=[item for item in items if item not in facing])
    items[:] = facing
    for item in facing:
        if item.get_closest_marker("local_server") is not None:
            item.add_marker(pytest.mark.skip(reason="needs the local S2 server's own features; "
                                                    "the run is against S2_TEST_ENDPOINT"))


@pytest.fixture
def s2_server(request: pytest.FixtureRequest) -> Any:
    """The S2 this test talks to: `local_s2` for a test marked `local_server`, else
    `target_s2`. Fixtures shared by a module take `target_s2` itself."""
    local = request.node.get_closest_marker("local_server") is not None
    return request.getfixturevalue("local_s2" if local else "target_s2")


@pytest.fixture(scope="session")
def target_s2(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The S2 the suite tests against, shared by the whole test session: a fresh in-memory
    s2-lite by default, the local server with `S2_TEST_SERVER=local`, or the S2 of
    `S2_TEST_ENDPOINT`."""
    if LITE:
        from s2_spark.testing.external import S2Lite

        with S2Lite() as lite:
            yield ExternalS2(lite.url, None)
        return
    if ENDPOINT is not None:
        yield ExternalS2(ENDPOINT, TOKEN)
        _delete_made_basins(ENDPOINT)
        return
    yield request.getfixturevalue("local_s2")


@pytest.fixture(scope="session")
def local_s2() -> Iterator[Any]:
    """An in-memory local S2 server on a free port, shared by the whole test session
    (heartbeats every 0.5 s, so tests see them soon)."""
    from s2_spark.testing import LocalS2Server

    with LocalS2Server(heartbeat_interval=0.5) as server:
        yield server


def _delete_made_basins(url: str) -> None:
    """Delete the basins this run made on an external S2 (named by `unique_name`)."""
    from s2_spark.s2 import S2Client

    with S2Client(s2_config(url)) as client:
        for info in list(client.list_basins()):
            if made_here(info.name):
                client.delete_basin(info.name, missing_ok=True)


@pytest.fixture(scope="session")
def ds_server() -> Iterator[Any]:
    """The Durable Streams reference server, in memory, long-poll timeout 1 s, shared."""
    from durable_testbed import DurableServer

    with DurableServer(long_poll_timeout=1.0) as server:
        yield server


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Make names unique per test, so tests sharing a server never see each other's data."""

    return unique_name


@pytest.fixture
def basin(s2_server: Any, unique: Callable[[str], str]) -> Iterator[Any]:
    """A new, empty basin on `s2_server` (its BasinClient); modules that
    need another kind of basin define their own `basin`."""
    from s2_spark.s2 import S2Client

    with S2Client(s2_config(s2_server.url)) as client:
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
