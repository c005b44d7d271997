"""Pipelines against s2-lite processes of their own: what the s2-lite the suite shares
(one a worker) cannot show, because each test kills its server.

s2-lite runs on a local folder (`--local-root`), so what it acknowledged survives SIGKILL;
killed at random under a streaming copy and started again on the same port and folder, the
copy rides it out in one run (the client retries until `RetryPolicy.timeout` without
progress) and the output holds every source record once, in order.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _records import data_records

from s2_spark.errors import ServiceError
from s2_spark.retry import RetryPolicy
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing.external import S2Lite

pytestmark = [pytest.mark.spark, pytest.mark.s2_lite]

T0 = (int(time.time()) - 3600) * 1000


@pytest.fixture
def lite(tmp_path: Path) -> Iterator[S2Lite]:
    with S2Lite(local_root=tmp_path / "lite") as server:
        yield server


class Killer(threading.Thread):
    """Kills `server` (SIGKILL) `times` times at random moments while `running()` holds,
    and starts it again on its port and folder after a random pause."""

    def __init__(self, server: S2Lite, running: Any, times: int, seed: int) -> None:
        super().__init__(daemon=True)
        self.server, self.running, self.times = server, running, times
        self.rng = random.Random(seed)
        self.kills = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while self.kills < self.times and self.running():
                time.sleep(self.rng.uniform(0.5, 2.5))
                if not self.running():
                    return
                self.server.kill()
                self.kills += 1
                time.sleep(self.rng.uniform(0.1, 1.0))
                self.server.start()
        except BaseException as exc:
            self.error = exc


def fill(client: S2Client, basin: str, stream: str, n: int) -> list[Any]:
    recs = [AppendRecord(f"r{i}".encode(), [(b"i", str(i).encode())], T0 + i) for i in range(n)]
    client.basin(basin).stream(stream).append_many(recs)
    return [(r.body, list(r.headers), r.timestamp) for r in recs]


def test_a_copy_rides_out_s2_lite_killed_and_restarted(
    spark: Any, lite: S2Lite, tmp_path: Path
) -> None:
    seed = random.randrange(2**32)
    basin = f"lite-kill-{uuid.uuid4().hex[:8]}"
    with S2Client(S2Config(endpoint=lite.url)) as client:
        client.create_basin(basin)
        client.basin(basin).create_stream("src")
        client.basin(basin).create_stream("out")
        source = fill(client, basin, "src", 20_000)
    opts = {"endpoint": lite.url, "basin": basin}
    df = (spark.readStream.format("s2").options(**opts, stream="src")
          .option("maxRecordsPerTrigger", "1000").load())
    query = (df.writeStream.format("s2").options(**opts, stream="out")
             .option("maxRecordsPerAppend", "100")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="0 seconds").start())
    killer = Killer(lite, lambda: query.isActive, times=3, seed=seed)
    killer.start()
    try:
        deadline = time.monotonic() + 240
        while killer.is_alive() or _copied(lite.url, basin) < len(source):
            assert query.isActive, f"seed {seed}: {query.exception()}"
            assert time.monotonic() < deadline, f"seed {seed}: the copy did not finish"
            time.sleep(0.5)
    finally:
        query.stop()
        killer.join(30)
    assert killer.error is None, killer.error
    assert killer.kills == 3, f"seed {seed}: the copy ended before the third kill"
    with S2Client(S2Config(endpoint=lite.url)) as client:
        got = data_records(client.basin(basin).stream("out"))
    assert [r[:2] for r in got] == [r[:2] for r in source], f"seed {seed}"


def _copied(url: str, basin: str) -> int:
    """`out`'s tail now (0 while the server is down): the copy's records and its marks."""
    try:
        with S2Client(S2Config(endpoint=url, retry=RetryPolicy(max_attempts=1))) as client:
            return client.basin(basin).stream("out").check_tail().seq_num
    except ServiceError:
        return 0
