"""Where Python has no `resource` module (Windows), the clients still import, and the tail
watch takes the connections a process may open to one host as its HTTP/1.1 limit.

Run by each wheel's own tests too, so on Windows by a real Windows Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from s2_spark._long_poll import _limits

_NO_RESOURCE = """
import sys

class _NoResource:
    def find_spec(self, name, path=None, target=None):
        if name == "resource":
            raise ImportError("no module named 'resource'")
        return None

sys.meta_path.insert(0, _NoResource())

import s2_spark.durable, s2_spark.wire.durable
from s2_spark.s2 import S2Client  # the package names its client lazily
from s2_spark._long_poll import _limits, watch_limit
assert _limits.resource is None
print(watch_limit())
"""


def test_without_the_resource_module_the_clients_import_and_the_watch_has_a_limit() -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_NO_RESOURCE)],
                          capture_output=True, text=True, timeout=120, check=True,
                          env=dict(os.environ))
    assert int(done.stdout) == _limits.NO_RLIMIT_CONNECTIONS - _limits.FD_RESERVE


def test_the_open_files_limit_where_there_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_limits, "resource", None)
    assert _limits.raise_open_files_limit() == _limits.NO_RLIMIT_CONNECTIONS
    assert _limits.watch_limit() == _limits.NO_RLIMIT_CONNECTIONS - _limits.FD_RESERVE
