"""A local S2-compatible server for tests, examples and users' own tests.

`LocalS2Server` runs in a background thread of this process; `ServerProcess` runs
`python -m s2_spark.testing` as a child (so tests can kill -9 and restart it). Both
serve HTTP/1.1 and h2c on one port, in memory or journaled to a data directory.
"""

from s2_spark.testing._server import LocalS2Server, ServerProcess

__all__ = ["LocalS2Server", "ServerProcess"]
