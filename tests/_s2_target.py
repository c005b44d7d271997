"""Which S2 the service-facing tests talk to. Each test runs once, against one server:

* By default, s2-lite, S2's own server (the pinned build, `s2_spark.testing.external`):
  each test session (each pytest worker) starts one, in memory, when a test first needs it.
* `S2_TEST_SERVER=local`: the local server instead (no cargo needed).
* `S2_TEST_ENDPOINT`: one URL serving account and basin operations (a running s2-lite, or
  S2 itself; the basin goes in the `S2-Basin` header). Only the S2-facing tests run,
  against it: tests that never meet `s2_server` are deselected, `local_server` ones skip.
* `S2_TEST_TOKEN`: the access token for the endpoint (s2-lite ignores tokens; S2 needs one).

Tests that need the local server's own features (request counters, fault hooks, proxies in
front, a token of their choosing, ...) are marked `@pytest.mark.local_server` and run
against the local server (one per worker, started when first needed) while the others meet
s2-lite. Names are unique per test (a random suffix), and the basins a run creates through
`unique` on an endpoint are deleted when the run ends.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

ENDPOINT: str | None = os.environ.get("S2_TEST_ENDPOINT") or None
TOKEN: str | None = os.environ.get("S2_TEST_TOKEN") or None
SERVER: str = os.environ.get("S2_TEST_SERVER") or "s2-lite"
if SERVER not in ("local", "s2-lite"):
    raise ValueError(f"S2_TEST_SERVER must be local or s2-lite (got {SERVER!r})")
LITE = SERVER == "s2-lite" and ENDPOINT is None
EXTERNAL = ENDPOINT is not None or LITE

#: Why a test that is not marked `local_server` fails when it reaches for the local server's
#: own features on another S2.
LOCAL_ONLY = "needs the local S2 server's own features: mark the test local_server"


#: Names `unique_name` made in this run: against an external S2, the basins named so (or
#: with such a name and a suffix) are deleted when the run ends.
MADE_NAMES: set[str] = set()


def unique_name(prefix: str) -> str:
    """`prefix` and a random suffix, remembered for the clean-up."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    MADE_NAMES.add(name)
    return name


def made_here(basin: str) -> bool:
    """Whether this run made the basin (a name from `unique_name`, or one plus a suffix)."""
    return basin in MADE_NAMES or basin.rsplit("-", 1)[0] in MADE_NAMES


def token(local: str | None = None) -> str | None:
    """The token a test sends: the external endpoint's own where one is set, else
    `local` (the local server and s2-lite take any)."""
    return TOKEN if EXTERNAL and TOKEN is not None else local


def s2_config(url: str, **kw: Any) -> Any:
    """An `S2Config` for `url` carrying the test endpoint's token (unless given)."""
    from s2_spark.s2 import S2Config

    kw.setdefault("access_token", token())
    return S2Config(endpoint=url, **kw)


class ExternalS2:
    """s2-lite or the external endpoint, in place of the local server in the `s2_server`
    fixture. What only the local server has fails the calling test: it belongs among the
    `local_server` ones."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def __repr__(self) -> str:
        return f"ExternalS2(url={self.url!r})"

    def _local_only(self, what: str) -> Any:
        import pytest

        pytest.fail(f"{LOCAL_ONLY} ({what})")

    def request_counts(self) -> dict[str, int]:
        return self._local_only("request counts")  # type: ignore[no-any-return]

    def append_counts(self) -> dict[str, int]:
        return self._local_only("append counts")  # type: ignore[no-any-return]

    def compressed_counts(self) -> dict[str, int]:
        return self._local_only("compression counts")  # type: ignore[no-any-return]

    def decompressed_counts(self) -> dict[str, int]:
        return self._local_only("compression counts")  # type: ignore[no-any-return]

    def inject_fault(self, *args: Any, **kwargs: Any) -> Any:
        return self._local_only("its fault hook")

    @property
    def store(self) -> Any:
        return self._local_only("its store")


def is_local(server: Any) -> bool:
    """Whether `server` (what `s2_server` gave) is the local server: its own features
    (request counts, compression counts, faults) are there to check."""
    return not isinstance(server, ExternalS2)
