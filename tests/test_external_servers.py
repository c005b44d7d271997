"""The helpers that pin, build and start servers the project does not ship
(`s2_spark.testing.external`): a build is made once per version into the cache and never
mistaken for one when it fails; a missing toolchain is named; Kafka's jar lists and its
readiness check. (s2-lite itself is built and run by every s2-lite test.)"""

from __future__ import annotations

import signal
import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from raw_server import RawServer

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing.external import CACHE_ENV, ExternalServerError, Pinned, S2Lite
from s2_spark.testing.external.kafka import MavenJars, _api_versions_answered, _stem


@dataclass(frozen=True)
class Scripted(Pinned):
    """A build that runs a Python snippet given the staging folder (as `root`)."""

    script: str = ""

    def build_command(self, root: Path) -> list[str]:
        return [sys.executable, "-c", f"root = {str(root)!r}\n{self.script}"]


MAKES_BINARY = """
import os, pathlib
os.makedirs(root + "/bin")
pathlib.Path(root, "bin", "server").write_text("built")
with open(os.environ["BUILDS_LOG"], "a") as log:
    log.write("build\\n")
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("BUILDS_LOG", str(tmp_path / "builds.log"))
    return tmp_path


def pinned(script: str, tool: str = "python3") -> Scripted:
    return Scripted(name="thing", version="1.2.3", tool=tool, hint="install the thing's kit",
                    binary="bin/server", script=script)


def test_a_version_is_built_once_into_the_cache(cache: Path) -> None:
    thing = pinned(MAKES_BINARY)
    path = thing.ensure_built()
    assert path == cache / "cache" / "thing" / "1.2.3" / "bin" / "server"
    assert path.read_text() == "built"
    assert thing.ensure_built() == path
    assert (cache / "builds.log").read_text() == "build\n"


def test_a_failed_build_says_so_and_leaves_nothing_that_passes_for_a_build(cache: Path) -> None:
    thing = pinned("import sys, os\nos.makedirs(root + '/bin')\nsys.exit(3)")
    with pytest.raises(ExternalServerError, match=r"building thing 1\.2\.3 failed \(exit 3\)"):
        thing.ensure_built()
    assert sorted(p.name for p in (cache / "cache" / "thing").iterdir()) == [".1.2.3.lock"]
    with pytest.raises(ExternalServerError, match=r"building thing 1\.2\.3 made no bin/server"):
        pinned("pass").ensure_built()


def test_a_missing_toolchain_is_named_with_what_to_install(cache: Path) -> None:
    with pytest.raises(ExternalServerError) as info:
        pinned(MAKES_BINARY, tool="no-such-toolchain-s2spark").ensure_built()
    assert str(info.value) == ("thing 1.2.3 is not built yet and `no-such-toolchain-s2spark` is "
                               "not on PATH: install the thing's kit")


def test_maven_jars_resolve_each_artifact_at_the_pinned_version(tmp_path: Path) -> None:
    jars = MavenJars(name="kafka", version="4.1.1", tool="mvn", hint="", binary="libs/x.jar",
                     artifacts=("org.apache.kafka:kafka_2.13", "org.apache.kafka:kafka-tools"))
    argv = jars.build_command(tmp_path)
    assert argv[:5] == ["mvn", "-q", "-B", "-f", str(tmp_path / "pom.xml")]
    assert f"-DoutputDirectory={tmp_path / 'libs'}" in argv
    pom = (tmp_path / "pom.xml").read_text()
    for artifact in ("kafka_2.13", "kafka-tools"):
        assert (f"<groupId>org.apache.kafka</groupId><artifactId>{artifact}</artifactId>"
                "<version>4.1.1</version>") in pom


@pytest.mark.parametrize(("jar", "stem"), [
    ("kafka-clients-3.9.2.jar", "kafka-clients"),
    ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
    ("commons-pool2-2.13.1.jar", "commons-pool2"),
    ("zstd-jni-1.5.6-10.jar", "zstd-jni"),
])
def test_a_jar_is_known_by_its_artifact_whatever_its_version(jar: str, stem: str) -> None:
    assert _stem(Path(jar)) == stem


class AnswersApiVersions(RawServer):
    def serve(self, conn: socket.socket) -> None:
        size = struct.unpack(">i", conn.recv(4))[0]
        correlation = struct.unpack(">hhi", conn.recv(size)[:8])[2]
        conn.sendall(struct.pack(">iih", 6, correlation, 0))


class AcceptsAndCloses(RawServer):
    def serve(self, conn: socket.socket) -> None:
        conn.recv(64)


def test_kafka_is_ready_only_once_it_answers_a_request() -> None:
    for server, ready in ((AnswersApiVersions(), True), (AcceptsAndCloses(), False)):
        with server:
            assert _api_versions_answered(int(server.url.rsplit(":", 1)[1])) is ready
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        assert _api_versions_answered(s.getsockname()[1]) is False


def test_an_in_memory_s2_lite_stops_at_once_under_a_following_read_session() -> None:
    """s2-lite's graceful shutdown waits for every live read session to end, and a
    following one never does, until its own drain timeout (10 s, wherever a suite ended
    with such a session). In memory there is nothing to keep: `stop` kills it."""
    with S2Lite() as lite, S2Client(S2Config(endpoint=lite.url)) as client:
        stream = client.basin(_made(client)).stream("s")
        stream.append([AppendRecord(b"x")])
        session = iter(stream.read_session(seq_num=0))
        assert next(session).count == 1  # live now, following past the tail
        process = lite._proc
        assert process is not None
        lite.stop(timeout=600)
        assert process.returncode == -signal.SIGKILL


def _made(client: S2Client) -> str:
    name = "stop-under-session"
    client.create_basin(name)
    client.basin(name).create_stream("s")
    return name
