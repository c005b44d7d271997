"""The suite's class archive of Spark (`_class_archive`): handed to JVMs only once it is
there, and mapped by a driver that got it (a JDK that refuses it says nothing: the suite
would only be slower, so this is where it shows)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _class_archive import use_archive
from conftest import CLASS_ARCHIVE


def test_drivers_get_the_archive_once_it_is_there(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Dmine=1")
    assert not use_archive(archive)
    assert os.environ["JAVA_TOOL_OPTIONS"] == "-Dmine=1"
    archive.write_bytes(b"")
    assert use_archive(archive) and use_archive(archive)
    opts = os.environ["JAVA_TOOL_OPTIONS"].split()
    assert opts[0] == "-Dmine=1" and opts.count(f"-XX:SharedArchiveFile={archive}") == 1


@pytest.mark.spark
def test_the_session_driver_maps_the_archive_it_was_given(spark: Any) -> None:
    pid = spark.sparkContext._gateway.proc.pid
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    tool = [e for e in environ if e.startswith(b"JAVA_TOOL_OPTIONS=")]
    given = [a.decode() for e in tool for a in e.split()
             if a.startswith(b"-XX:SharedArchiveFile=")]
    if CLASS_ARCHIVE is None or not given:
        pytest.skip("this session's driver started before the class archive was made")
    assert given == [f"-XX:SharedArchiveFile={CLASS_ARCHIVE}"]
    assert str(CLASS_ARCHIVE) in Path(f"/proc/{pid}/maps").read_text(), (
        "the JDK refused the class archive (another class path or jar set?)")
