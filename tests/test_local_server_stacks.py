"""The local server's HTTP stacks: granian where installed, hypercorn as the fallback.

Both serve the same app on one port (HTTP/1.1 and h2c), the choice is logged, and a
server stopping ends the long-polls still waiting instead of waiting for them.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import pytest

from s2_spark.testing import LocalS2Server, ServerProcess
from s2_spark.testing.serving import granian_stack, stack

STACKS = ["granian", "hypercorn"]


def _basin_and_stream(url: str, basin: str) -> dict[str, str]:
    headers = {"s2-basin": basin}
    with httpx.Client(base_url=url + "/v1", timeout=30) as c:
        assert c.post("/basins", json={"basin": basin}).status_code == 201
        assert c.post("/streams", headers=headers, json={"stream": "a/b"}).status_code == 201
    return headers


@pytest.mark.parametrize("name", STACKS)
def test_each_stack_serves_http1_and_h2c_on_one_port(name: str) -> None:
    with LocalS2Server(stack=name) as server:
        assert server.stack == name
        headers = _basin_and_stream(server.url, "stack-basin")
        seen = []
        for http2 in (False, True):
            with httpx.Client(http1=not http2, http2=http2, timeout=30) as c:
                # An escaped "/" stays inside the stream name on both.
                r = c.post(server.url + "/v1/streams/a%2Fb/records", headers=headers,
                           json={"records": [{"body": f"via {name}"}]})
                assert r.status_code == 200, r.text
                r = c.get(server.url + "/v1/streams/a%2Fb/records/tail", headers=headers)
                seen.append((r.http_version, r.json()["tail"]["seq_num"]))
        assert seen == [("HTTP/1.1", 1), ("HTTP/2", 2)]
        assert server.request_counts() == {"append": 2, "check_tail": 2, "create_basin": 1,
                                           "create_stream": 1}


def test_auto_takes_granian_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="s2_spark.testing.server"):
        assert stack.choose("auto")[0] == "granian"
    assert "local S2 server on granian" in caplog.text


def test_auto_falls_back_to_hypercorn_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(granian_stack, "available", lambda: "granian is not installed (test)")
    with caplog.at_level(logging.INFO, logger="s2_spark.testing.server"):
        assert stack.choose("auto")[0] == "hypercorn"
    assert "local S2 server on hypercorn: granian is not installed (test)" in caplog.text
    with pytest.raises(RuntimeError, match="'granian' cannot run here: granian is not"):
        stack.choose("granian")


def test_an_unknown_stack_is_named_with_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="unknown HTTP stack 'uvicorn': use auto, granian, "
                                         "hypercorn"):
        LocalS2Server(stack="uvicorn").start()


@pytest.mark.parametrize("name", STACKS)
@pytest.mark.parametrize("kind", [LocalS2Server, ServerProcess])
def test_stopping_ends_long_polls_waiting_over_http1_and_http2(name: str, kind: Any) -> None:
    """Long-polls of 60 s are answered 503 (retryable) when the server stops, over both
    protocols; a process exits by itself on SIGTERM (code 0, not killed after `stop`'s
    timeout)."""
    server = kind(stack=name).start()
    try:
        headers = _basin_and_stream(server.url, "stopping-basin")
        answers: list[Any] = []
        sent = threading.Barrier(5)

        def poll(http2: bool) -> None:
            with httpx.Client(http1=not http2, http2=http2, timeout=90) as c:
                sent.wait(30)
                try:
                    r = c.get(server.url + "/v1/streams/a%2Fb/records?seq_num=0&wait=60",
                              headers=headers)
                    answers.append((r.http_version, r.status_code, r.json()["code"]))
                except httpx.HTTPError as e:  # the connection went away first
                    answers.append((type(e).__name__,))

        threads = [threading.Thread(target=poll, args=(h2,)) for h2 in (False, True) * 2]
        for t in threads:
            t.start()
        sent.wait(30)
        deadline = time.monotonic() + 30
        while server.request_counts().get("read_wait", 0) < 4:  # every poll is waiting
            assert time.monotonic() < deadline, server.request_counts()
            time.sleep(0.05)
        proc = getattr(server, "_proc", None)
        server.stop()
        if proc is not None:
            assert proc.returncode == 0  # exited on SIGTERM, not killed
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        answered = sorted(a for a in answers if len(a) == 3)
        # HTTP/1.1 polls are always answered; an HTTP/2 one may see its connection's
        # GOAWAY first (httpx's h2 then fails the stream), never a hang.
        assert ("HTTP/1.1", 503, "unavailable") in answered
        assert all(a[1:] == (503, "unavailable") for a in answered)
        assert len(answers) == 4
    finally:
        server.stop()
