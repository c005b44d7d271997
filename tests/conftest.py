"""Shared fixtures: one local S2 server, one Durable Streams reference server and one
SparkSession per test session.

Spark workers run `sys.executable`, the interpreter that has s2_spark installed.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


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
