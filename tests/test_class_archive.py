"""The suite's class archive of Spark (`_class_archive`): handed to JVMs only once it is
there, and mapped by a driver that got it (a JDK that refuses it says nothing: the suite
would only be slower, so this is where it shows)."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _class_archive import await_archive, use_archive
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


def test_the_suite_waits_for_a_maker_at_work(tmp_path: Path) -> None:
    """While a maker holds the lock, `await_archive` waits for the archive; with no maker
    at work (the lock free, or never taken), it returns at once."""
    archive = tmp_path / "spark.jsa"
    assert not await_archive(archive, timeout=30)  # never started
    maker = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, pathlib, sys, time\n"
        f"lock = open({str(archive)!r} + '.lock', 'w')\n"
        "fcntl.flock(lock, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.readline()\n"
        f"pathlib.Path({str(archive)!r}).write_bytes(b'jsa')\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert maker.stdout is not None and maker.stdin is not None
    assert maker.stdout.readline() == "locked\n"
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(await_archive, archive)
    with pytest.raises(concurrent.futures.TimeoutError):
        waiting.result(timeout=0.5)  # the maker is at work: still waiting
    maker.stdin.write("done\n")
    maker.stdin.flush()
    assert waiting.result(timeout=30) and maker.wait(30) == 0
    archive.unlink()
    assert not await_archive(archive, timeout=30)  # the lock free: no maker at work
