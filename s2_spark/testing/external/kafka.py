"""Apache Kafka, one broker in KRaft mode, for side-by-side benchmarks (not the suite).

`KAFKA` pins the broker's jars (`org.apache.kafka:kafka_2.13` and `kafka-tools`, with
their dependencies, resolved by Maven into the cache); `spark_kafka_jars(version)` does the
same for Spark's Kafka source and sink (`spark-sql-kafka-0-10_2.13`) at the PySpark version
in use, and `Kafka.spark_jars()` lists those of them that PySpark does not ship already
(for `spark.jars`). `Kafka` runs the broker on a free port of 127.0.0.1 with its log in a
temporary folder, formatted at each start::

    with Kafka() as kafka:
        kafka.create_topic("events", partitions=2)
        spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from s2_spark.testing.external._process import (
    ExternalServer,
    ExternalServerError,
    Pinned,
    free_port,
)

__all__ = ["KAFKA", "Kafka", "MavenJars", "spark_kafka_jars"]

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>s2-spark.external</groupId><artifactId>{name}</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>{dependencies}
  </dependencies>
</project>
"""


@dataclass(frozen=True)
class MavenJars(Pinned):
    """Maven Central artifacts at `version`, with their runtime dependencies, as jars in
    `libs/` (`mvn dependency:copy-dependencies`); `binary` is the first artifact's jar."""

    artifacts: tuple[str, ...] = ()  # group:artifact

    def build_command(self, root: Path) -> list[str]:
        deps = "".join(
            f"\n    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
            f"<version>{self.version}</version></dependency>"
            for g, a in (artifact.split(":") for artifact in self.artifacts))
        pom = root / "pom.xml"
        pom.write_text(_POM.format(name=self.name, dependencies=deps))
        return ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                "-DincludeScope=runtime", f"-DoutputDirectory={root / 'libs'}"]

    @property
    def jars(self) -> list[Path]:
        return sorted((self.folder / "libs").glob("*.jar"))


def _maven(name: str, version: str, *artifacts: str) -> MavenJars:
    return MavenJars(name=name, version=version, artifacts=artifacts, tool="mvn",
                     hint="install Maven (and Java 17), which resolve the jars from Maven "
                          "Central", binary=f"libs/{artifacts[0].split(':')[1]}-{version}.jar")


KAFKA = _maven("kafka", "4.1.1", "org.apache.kafka:kafka_2.13", "org.apache.kafka:kafka-tools")


def spark_kafka_jars(spark_version: str) -> MavenJars:
    """Spark's Kafka source and sink at `spark_version` (that of the PySpark in use)."""
    return _maven("spark-sql-kafka", spark_version,
                  "org.apache.spark:spark-sql-kafka-0-10_2.13")


def _stem(jar: Path) -> str:
    """The artifact of a jar named `<artifact>-<version>.jar` (`kafka-clients-4.1.1.jar`:
    `kafka-clients`), the version starting at the first `-<digits>.`."""
    name = jar.name.removesuffix(".jar")
    found = re.match(r"(.+?)-\d+\.", name)
    return found.group(1) if found else name


class Kafka(ExternalServer):
    """One Kafka broker (its own KRaft controller), on `port` with its controller on
    another free port, its log in a temporary folder removed at `close()`."""

    name = "kafka"

    def __init__(self, *, port: int = 0, start_timeout: float = 90.0,
                 heap: str = "1g") -> None:
        super().__init__(port=port, start_timeout=start_timeout)
        self.heap = heap
        self._dir: Path | None = None

    @property
    def bootstrap(self) -> str:
        """`kafka.bootstrap.servers`."""
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str) -> list[str]:
        KAFKA.ensure_built()
        return ["java", f"-Xmx{self.heap}", "-cp", f"{KAFKA.folder / 'libs'}/*", main, *args]

    def _configure(self) -> Path:
        """A fresh log folder and its `server.properties`, formatted."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = Path(tempfile.mkdtemp(prefix="kafka-"))
        controller = free_port()
        props = self._dir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={self._dir / 'log'}", "num.partitions=1",
            "offsets.topic.replication.factor=1", "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1", "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false", ""]))
        self._run(self._java("kafka.tools.StorageTool", "format", "-t",
                             uuid.uuid4().hex[:22], "-c", str(props)), "formatting its log")
        return props

    def command(self) -> Sequence[str]:
        return self._java("kafka.Kafka", str(self._configure()))

    def answers(self) -> bool:
        return _api_versions_answered(self.port)

    def create_topic(self, topic: str, *, partitions: int = 1) -> None:
        self._run(self._java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server",
                             self.bootstrap, "--create", "--topic", topic, "--partitions",
                             str(partitions), "--replication-factor", "1"),
                  f"creating topic {topic}")

    @staticmethod
    def spark_jars(spark_version: str, spark_home: str | os.PathLike[str]) -> list[Path]:
        """Spark's Kafka connector and what it needs that `spark_home/jars` lacks (a jar
        PySpark ships, Hadoop's client among them, is left to PySpark's own version)."""
        pinned = spark_kafka_jars(spark_version)
        pinned.ensure_built()
        shipped = {_stem(j) for j in Path(spark_home, "jars").glob("*.jar")}
        return [j for j in pinned.jars if _stem(j) not in shipped]

    def _run(self, argv: list[str], what: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ExternalServerError(f"kafka: {what} failed (exit {done.returncode}): "
                                      f"{(done.stderr or done.stdout)[-2000:]}")

    def close(self) -> None:
        super().close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _api_versions_answered(port: int) -> bool:
    """Whether a broker on `port` answers an ApiVersions request (v0): it serves clients
    only once started, though its port may accept connections before."""
    request = struct.pack(">hhih", 18, 0, 1, 5) + b"ready"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            head = sock.recv(8)
    except OSError:
        return False
    return len(head) == 8 and struct.unpack(">ii", head)[1] == 1
