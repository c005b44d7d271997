"""s2-lite, S2's own server (crate `s2-lite`, binary `server`), as a test resource.

`S2_LITE` pins the version this project is tested against; `ensure_built()` builds it
with cargo into the cache (`cargo install s2-lite --version =V --locked --bin server`;
a few hundred crates, tens of minutes on 2 cores the first time). `S2Lite` runs it on a
free port of 127.0.0.1, in memory or on a local folder (`local_root`) that survives a
kill and restart::

    from s2_spark.testing import S2Lite

    with S2Lite() as lite:              # builds on first use; or S2Lite(binary="...")
        url = lite.url                  # one URL for account and basin calls

A binary of your own (`s2 lite` from S2's CLI is the same server) is used with
`binary=`, or `S2_LITE_BINARY` in the environment.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from s2_spark.testing.external._process import ExternalServer, Pinned

__all__ = ["BINARY_ENV", "S2_LITE", "S2Lite"]

#: A binary of s2-lite to use instead of the pinned build.
BINARY_ENV = "S2_LITE_BINARY"


@dataclass(frozen=True)
class CargoBinary(Pinned):
    """A binary of a crates.io crate, built by `cargo install --locked`."""

    crate: str = ""

    def build_command(self, root: Path) -> list[str]:
        return ["cargo", "install", self.crate, "--version", f"={self.version}", "--locked",
                "--bin", Path(self.binary).name, "--root", str(root)]


S2_LITE = CargoBinary(
    name="s2-lite", version="0.43.4", crate="s2-lite", binary="bin/server", tool="cargo",
    hint="install Rust's toolchain (https://rustup.rs), or set S2_LITE_BINARY to an s2-lite "
         "server binary you have")


class S2Lite(ExternalServer):
    """One s2-lite process: in memory, or on `local_root` (a folder kept across restarts,
    so `kill()` then `start()` finds every acknowledged append)."""

    name = "s2-lite"

    def __init__(self, *, binary: str | os.PathLike[str] | None = None,
                 local_root: str | os.PathLike[str] | None = None, port: int = 0,
                 start_timeout: float = 60.0) -> None:
        super().__init__(port=port, start_timeout=start_timeout)
        chosen = binary if binary is not None else os.environ.get(BINARY_ENV) or None
        self.binary = Path(chosen) if chosen is not None else None
        self.local_root = None if local_root is None else Path(local_root)

    def __repr__(self) -> str:
        return f"S2Lite(url={self.url!r}, local_root={self.local_root!r})"

    def command(self) -> Sequence[str]:
        binary = self.binary if self.binary is not None else S2_LITE.ensure_built()
        argv = [str(binary), "--port", str(self.port)]
        if self.local_root is not None:
            argv += ["--local-root", str(self.local_root)]
        return argv

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("S2LITE_NO_DASHBOARD", "1")
        env.setdefault("RUST_LOG", "warn")
        return env

    def stop(self, timeout: float = 10.0) -> None:
        """On `local_root`, SIGTERM then SIGKILL after `timeout` seconds (as every server
        here). In memory there is nothing to keep, and s2-lite's graceful shutdown waits
        for every live read session to end, which a following one never does, until its
        own drain timeout (10 s): killed at once."""
        if self.local_root is None:
            self.kill()
        else:
            super().stop(timeout)

    def answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False
