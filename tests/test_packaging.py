"""The package as users install it: its version from one place, the changelog's newest
section, the `s2-spark-server` command, the wheels cibuildwheel is configured to build,
and the C decoders optional from source but required in a wheel build."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

import s2_spark

ROOT = Path(__file__).resolve().parent.parent


def _check_release() -> Any:
    spec = importlib.util.spec_from_file_location("check_release",
                                                  ROOT / "scripts" / "check_release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_version_is_the_one_pip_reports_and_the_changelog_has_its_section() -> None:
    check = _check_release()
    assert s2_spark.__version__ == check.package_version()
    assert importlib.metadata.version("s2-spark") == s2_spark.__version__
    assert check.problems(None) == []


def test_a_tag_must_be_the_version_and_its_changelog_section_dated(tmp_path: Path) -> None:
    check = _check_release()
    (tmp_path / "s2_spark").mkdir()
    (tmp_path / "s2_spark" / "_version.py").write_text('__version__ = "1.2.0"\n')
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n## [1.2.0] - Unreleased\n\n## [1.1.0] - 2026-01-02\n")
    assert check.problems(None, tmp_path) == []
    assert check.problems("v1.2.0", tmp_path) == [
        "CHANGELOG.md's section for 1.2.0 has no date: head it '## [1.2.0] - YYYY-MM-DD' "
        "before tagging"
    ]
    changelog.write_text("# Changelog\n\n## [1.2.0] - 2026-02-03\n\n## [1.1.0] - 2026-01-02\n")
    assert check.problems("v1.2.0", tmp_path) == []
    assert check.problems("v1.1.0", tmp_path) == [
        "the tag is v1.1.0, the package's version is 1.2.0: tag v1.2.0"
    ]
    (tmp_path / "s2_spark" / "_version.py").write_text('__version__ = "1.3.0"\n')
    assert check.problems(None, tmp_path) == [
        "the newest section of CHANGELOG.md is 1.2.0, the package's version is 1.3.0 "
        "(s2_spark/_version.py)"
    ]


def test_s2_spark_server_is_the_local_servers_command() -> None:
    from s2_spark.testing.__main__ import main

    (script,) = importlib.metadata.entry_points(group="console_scripts", name="s2-spark-server")
    assert script.load() is main


EXPECTED_WHEELS = {
    "linux": [f"{py}-{platform}" for platform in
              ("manylinux_x86_64", "manylinux_aarch64", "musllinux_x86_64")
              for py in ("cp311", "cp312", "cp313", "cp314")],
    "macos": [f"{py}-macosx_{arch}" for py in ("cp311", "cp312", "cp313", "cp314")
              for arch in ("x86_64", "arm64")],
    "windows": [f"{py}-win_amd64" for py in ("cp311", "cp312", "cp313", "cp314")],
}


@pytest.mark.parametrize("platform", sorted(EXPECTED_WHEELS))
def test_cibuildwheel_builds_cpython_311_to_314_on_each_platform(platform: str) -> None:
    if shutil.which("cibuildwheel") is None:
        pytest.skip("cibuildwheel is not installed (the dev extra has it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    done = subprocess.run(["cibuildwheel", "--print-build-identifiers", "--platform", platform],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == sorted(EXPECTED_WHEELS[platform])


def _build_ext(tmp_path: Path, require: bool) -> subprocess.CompletedProcess[str]:
    """setup.py's build_ext with a C compiler that does not exist."""
    env = {k: v for k, v in os.environ.items() if k != "S2_SPARK_REQUIRE_C"}
    env["CC"] = str(tmp_path / "no-such-cc")
    if require:
        env["S2_SPARK_REQUIRE_C"] = "1"
    return subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.skipif(sys.platform == "win32", reason="the compiler is chosen by CC on POSIX")
def test_without_a_compiler_an_install_from_source_has_no_decoders(tmp_path: Path) -> None:
    done = _build_ext(tmp_path, require=False)
    assert done.returncode == 0, done.stderr
    for name in ("_fastwire", "_fastjson"):
        assert f'building extension "s2_spark.wire.{name}" failed' in done.stderr
    assert not list((tmp_path / "lib").rglob("_fast*"))


@pytest.mark.skipif(sys.platform == "win32", reason="the compiler is chosen by CC on POSIX")
def test_a_wheel_build_fails_where_the_decoders_do_not_compile(tmp_path: Path) -> None:
    done = _build_ext(tmp_path, require=True)
    assert done.returncode != 0
    assert "no-such-cc" in done.stderr + done.stdout
    assert not list((tmp_path / "lib").rglob("_fast*"))


@pytest.mark.skipif(sys.platform == "win32" or bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
                    reason="abi3 builds with POSIX extension names")
def test_an_editable_build_removes_per_version_builds_that_would_shadow_it(
        tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "s2_spark", tree / "s2_spark",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    wire = tree / "s2_spark" / "wire"
    stale = wire / "_fastwire.cpython-311-x86_64-linux-gnu.so"
    free_threaded = wire / "_fastwire.cpython-313t-x86_64-linux-gnu.so"
    stale.write_bytes(b"")
    free_threaded.write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if k != "S2_SPARK_REQUIRE_C"}
    done = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in wire.glob("_fast*.so")) == [
        "_fastjson.abi3.so", "_fastwire.abi3.so", free_threaded.name]
