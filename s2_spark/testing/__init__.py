"""A local S2-compatible server for tests, examples and users' own tests.

`LocalS2Server` runs in a background thread of this process; `ServerProcess` runs
`python -m s2_spark.testing` as a child (so tests can kill -9 and restart it). Both
serve HTTP/1.1 and h2c (HTTP/2 with prior knowledge, what s2-sdk speaks over
`http://`) on one port, in memory or journaled to a data directory::

    from s2_spark.testing import LocalS2Server

    with LocalS2Server() as server:
        ...  # point a client at server.url, e.g. "http://127.0.0.1:40123"

The API follows S2's OpenAPI spec and s2-lite's behaviour: basins and streams, appends
(JSON, protobuf, S2S sessions), reads (JSON, protobuf, SSE, S2S sessions), check tail,
command records, retention and access-token checks (`token=`). A deleted stream or basin
is deletion pending (409 `stream_deletion_pending`, listed with `deleted_at`) for
`deletion_delay` seconds (default 0, as s2-lite), then gone (404). Testing only, not S2:
`inject_fault` makes the server answer an S2 error to the next requests of a kind.

`S2Lite` runs s2-lite, S2's own server, the pinned build this project tests against
(built with cargo into a cache folder on first use) or a binary of yours
(`S2_LITE_BINARY`), in memory or on a folder that survives `kill()` (`external.s2_lite`).

`TcpProxy` sits between a client and a server and cuts or resets connections the way
flaky networks do, for fault-injection tests; `DelayProxy` adds a round trip like a real
service's, for benchmarks.

Inside, three folders: `serving` runs the server (HTTP stack, thread or child process,
ASGI plumbing, request counters), `semantics` is S2 as s2-lite implements it (routing,
handlers, bodies, the store, reads, names, configurations, errors), `proxies` holds
the test proxies that stand between a client and a server, and `external` the servers
this project does not ship (s2-lite), pinned, built, started and stopped one way.
"""

from s2_spark.testing.external import S2Lite
from s2_spark.testing.proxies.delay import DelayProxy
from s2_spark.testing.proxies.tcp import TcpProxy
from s2_spark.testing.serving.server import LocalS2Server, ServerProcess, ServerTls

__all__ = ["DelayProxy", "LocalS2Server", "S2Lite", "ServerProcess", "ServerTls", "TcpProxy"]
