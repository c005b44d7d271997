#!/usr/bin/env python3
"""Durable Streams client conformance adapter for s2_spark.durable.

The durable-streams repository's client conformance suite (packages/client-conformance-tests)
spawns this file and drives it with one JSON command per stdin line; it answers with exactly
one JSON result per line on stdout (logs go to stderr). Every protocol action goes through
s2_spark.durable; this file only translates commands, results and error codes.

Run with an interpreter that has s2-spark installed; when started by another one it re-runs
itself with the repository's .venv if there is one.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

try:
    from s2_spark.durable import (
        DurableConfig,
        DurableStream,
        DurableStreamsClient,
        IdempotentProducer,
        ReadChunk,
        RetryPolicy,
    )
    from s2_spark.errors import (
        DurableStreamsError,
        MalformedResponseError,
        StreamBadRequestError,
        StreamClosedError,
        StreamConflictError,
        StreamNotFoundError,
    )
except ImportError:  # pragma: no cover - started by a Python without s2-spark
    venv = Path(__file__).resolve().parents[2] / ".venv"
    if (venv / "bin" / "python").exists() and Path(sys.prefix).resolve() != venv.resolve():
        python = str(venv / "bin" / "python")
        os.execv(python, [python, __file__, *sys.argv[1:]])
    raise

FEATURES = {
    "batching": True,
    "sse": True,
    "longPoll": True,
    "auto": True,
    "streaming": True,
    "retryOptions": True,
    "batchItems": True,
    "strictZeroValidation": True,
}
# The suite wants the offending option named as its own (camelCase) option.
CAMEL = {
    "max_batch_messages": "maxBatchItems",
    "max_batch_bytes": "maxBatchBytes",
    "producer_id": "producerId",
    "max_attempts": "maxRetries (+1)",
    "initial_backoff": "initialDelayMs (/1000)",
    "max_backoff": "maxDelayMs (/1000)",
}


def camel(message: str) -> str:
    for snake, name in CAMEL.items():
        message = message.replace(snake, name)
    return message


class Adapter:
    def __init__(self) -> None:
        self.client: DurableStreamsClient | None = None
        self.content_types: dict[str, str] = {}
        self.producers: dict[tuple[str, str, int], IdempotentProducer] = {}

    # -- plumbing ------------------------------------------------------------------------

    def stream(self, path: str) -> DurableStream:
        assert self.client is not None, "init must come first"
        return self.client.stream(path, content_type=self.content_types.get(path))

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        kind = cmd["type"]
        method = getattr(self, "do_" + kind.replace("-", "_"), None)
        if method is None:
            return error(kind, "NOT_SUPPORTED", f"command {kind!r} is not supported")
        try:
            result: dict[str, Any] = method(cmd)
        except DurableStreamsError as exc:
            return error(kind, error_code(kind, exc, cmd), exc.message, exc.status or None)
        except ValueError as exc:
            return error(kind, "INVALID_ARGUMENT", str(exc))
        return {"type": kind, "success": True, **result}

    # -- commands ------------------------------------------------------------------------

    def do_init(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if self.client is not None:
            self.client.close()
        self.client = DurableStreamsClient(
            DurableConfig(base_url=cmd["serverUrl"], retry=RetryPolicy(max_attempts=6))
        )
        self.content_types.clear()
        self.producers.clear()
        return {"clientName": "s2-spark", "clientVersion": "0.1.0", "features": FEATURES}

    def do_create(self, cmd: dict[str, Any]) -> dict[str, Any]:
        content_type = cmd.get("contentType") or "application/octet-stream"
        data = cmd.get("data")
        result = self.stream(cmd["path"]).create(
            content_type,
            ttl=cmd.get("ttlSeconds"),
            expires_at=cmd.get("expiresAt"),
            body=data.encode() if data else None,
            closed=bool(cmd.get("closed")),
            headers=cmd.get("headers"),
        )
        self.content_types[cmd["path"]] = content_type
        return {"status": 201 if result.created else 200, "offset": result.next_offset}

    def do_connect(self, cmd: dict[str, Any]) -> dict[str, Any]:
        info = self.stream(cmd["path"]).head(headers=cmd.get("headers"))
        if info.content_type:
            self.content_types[cmd["path"]] = info.content_type
        return {"status": 200, "offset": info.next_offset}

    def do_head(self, cmd: dict[str, Any]) -> dict[str, Any]:
        info = self.stream(cmd["path"]).head(headers=cmd.get("headers"))
        if info.content_type:
            self.content_types[cmd["path"]] = info.content_type
        out: dict[str, Any] = {
            "status": 200,
            "offset": info.next_offset,
            "contentType": info.content_type,
            "streamClosed": info.closed,
        }
        if info.ttl is not None:
            out["ttlSeconds"] = info.ttl
        if info.expires_at is not None:
            out["expiresAt"] = info.expires_at
        return out

    def do_delete(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.stream(cmd["path"]).delete(headers=cmd.get("headers"))
        self.content_types.pop(cmd["path"], None)
        return {"status": 200}

    def do_append(self, cmd: dict[str, Any]) -> dict[str, Any]:
        data = cmd.get("data", "")
        body = base64.b64decode(data) if cmd.get("binary") else data.encode()
        seq = cmd.get("seq")
        # The suite expects a 5xx on a plain append to be retried (the reference clients
        # do); the client's default keeps unknown outcomes unretried, so opt in here.
        result = self.stream(cmd["path"]).append(
            body,
            seq=None if seq is None else str(seq),
            headers=cmd.get("headers"),
            retry_unknown=True,
        )
        return {"status": 200, "offset": result.next_offset}

    def do_close(self, cmd: dict[str, Any]) -> dict[str, Any]:
        s = self.stream(cmd["path"])
        if cmd.get("contentType"):
            s.content_type = cmd["contentType"]
        result = s.close(cmd.get("data"), headers=cmd.get("headers"))
        return {"finalOffset": result.next_offset}

    def do_read(self, cmd: dict[str, Any]) -> dict[str, Any]:
        return ReadCommand(self, cmd).run()

    def producer(self, cmd: dict[str, Any]) -> IdempotentProducer:
        key = (cmd["path"], cmd["producerId"], int(cmd.get("epoch", 0)))
        p = self.producers.get(key)
        if p is None:
            p = IdempotentProducer(
                self.stream(cmd["path"]),
                cmd["producerId"],
                epoch=key[2],
                auto_claim=bool(cmd.get("autoClaim")),
            )
            self.producers[key] = p
        return p

    def do_idempotent_append(self, cmd: dict[str, Any]) -> dict[str, Any]:
        p = self.producer(cmd)
        p.append_raw(cmd["data"])
        result = p.flush()
        assert result is not None
        return {
            "status": 200,
            "offset": result.next_offset,
            "duplicate": result.duplicate,
            "producerSeq": result.producer_seq,
        }

    def do_idempotent_append_batch(self, cmd: dict[str, Any]) -> dict[str, Any]:
        # A batch command is one producer session from seq 0: sending the same batch again
        # with the same id and epoch is a retry, deduplicated by the server.
        # With maxInFlight > 1 each item is its own batch, so the batches are pipelined.
        in_flight = int(cmd.get("maxInFlight") or 1)
        p = IdempotentProducer(
            self.stream(cmd["path"]),
            cmd["producerId"],
            epoch=int(cmd.get("epoch", 0)),
            auto_claim=bool(cmd.get("autoClaim")),
            max_in_flight=in_flight,
            max_batch_messages=1 if in_flight > 1 else 10_000,
        )
        with p:
            for item in cmd["items"]:
                p.append_raw(item)
        return {"status": 200}

    def do_idempotent_close(self, cmd: dict[str, Any]) -> dict[str, Any]:
        p = self.producer(cmd)
        data = cmd.get("data")
        body = None if data is None else data.encode()
        p.flush()
        result = p.send(body or b"", close=True)
        return {"status": 200, "finalOffset": result.next_offset}

    def do_idempotent_detach(self, cmd: dict[str, Any]) -> dict[str, Any]:
        key = (cmd["path"], cmd["producerId"], int(cmd.get("epoch", 0)))
        p = self.producers.pop(key, None)
        if p is not None:
            p.flush()
        return {"status": 200}

    def do_validate(self, cmd: dict[str, Any]) -> dict[str, Any]:
        target = cmd["target"]
        if target.get("target") == "retry-options":
            return self.validate_retry(target)
        if target.get("target") != "idempotent-producer":
            raise NotSupported(f"validation of {target.get('target')!r} is not supported")
        kwargs: dict[str, Any] = {}
        if "epoch" in target:
            kwargs["epoch"] = target["epoch"]
        if "maxBatchBytes" in target:
            kwargs["max_batch_bytes"] = target["maxBatchBytes"]
        if "maxBatchItems" in target:
            kwargs["max_batch_messages"] = target["maxBatchItems"]
        try:
            IdempotentProducer.check_options(target.get("producerId", "p"), **kwargs)
        except ValueError as exc:
            raise ValueError(camel(str(exc))) from None
        return {}

    def validate_retry(self, target: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if "maxRetries" in target:
            kwargs["max_attempts"] = target["maxRetries"] + 1
        if "initialDelayMs" in target:
            kwargs["initial_backoff"] = target["initialDelayMs"] / 1000
        if "maxDelayMs" in target:
            kwargs["max_backoff"] = target["maxDelayMs"] / 1000
        if "multiplier" in target:
            kwargs["multiplier"] = target["multiplier"]
        try:
            RetryPolicy(**kwargs)
        except ValueError as exc:
            raise ValueError(camel(str(exc))) from None
        return {}

    def do_shutdown(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if self.client is not None:
            self.client.close()
        return {}


class NotSupported(DurableStreamsError):
    pass


class ReadCommand:
    """One `read`: collect non-empty chunks until the command's stop condition."""

    def __init__(self, adapter: Adapter, cmd: dict[str, Any]) -> None:
        self.adapter = adapter
        self.cmd = cmd
        live = cmd.get("live")
        self.live = {None: None, False: None, True: "auto"}.get(live, live)
        self.deadline = time.monotonic() + cmd.get("timeoutMs", 5000) / 1000
        self.max_chunks = cmd.get("maxChunks", 100)
        self.wait_up_to_date = bool(cmd.get("waitForUpToDate"))

    def run(self) -> dict[str, Any]:
        path = self.cmd["path"]
        s = self.adapter.stream(path)
        offset = self.cmd.get("offset") or "-1"
        reader = s.read(offset, live=self.live, headers=self.cmd.get("headers"))
        chunks: list[dict[str, Any]] = []
        status = 200
        last: ReadChunk | None = None
        timed_out = False
        with reader:
            for chunk in reader:
                last = chunk
                status = chunk.status
                if chunk.content_type and chunk.status == 200 and self.live != "sse":
                    self.adapter.content_types[path] = chunk.content_type
                text = chunk_text(chunk)
                if text:
                    chunks.append({"data": text, "offset": chunk.next_offset})
                if self.stop(chunk, len(chunks)):
                    break
                if time.monotonic() >= self.deadline:
                    timed_out = True
                    break
        return {
            "status": 200 if chunks else status,
            "chunks": chunks,
            "offset": reader.offset,
            "upToDate": bool(last and last.up_to_date) or (timed_out and not chunks),
            "streamClosed": reader.closed,
            **({"cursor": reader.cursor} if reader.cursor else {}),
        }

    def stop(self, chunk: ReadChunk, count: int) -> bool:
        if chunk.closed or count >= self.max_chunks:
            return True
        if self.live is None:
            return chunk.up_to_date
        if self.wait_up_to_date and chunk.up_to_date:
            return True
        # A long-poll that timed out with nothing new ends the read, as in the reference
        # adapters; SSE keep-alives do not.
        return self.live in ("long-poll", "auto") and chunk.status == 204


def chunk_text(chunk: ReadChunk) -> str:
    if chunk.json_mode:
        messages = chunk.messages()
        return json.dumps(messages, separators=(",", ":"), ensure_ascii=False) if messages else ""
    return chunk.data.decode("utf-8", errors="replace")


def error_code(kind: str, exc: DurableStreamsError, cmd: dict[str, Any]) -> str:
    if isinstance(exc, NotSupported):
        return "NOT_SUPPORTED"
    if isinstance(exc, StreamNotFoundError):
        return "NOT_FOUND"
    if isinstance(exc, StreamClosedError):
        return "STREAM_CLOSED"
    if isinstance(exc, StreamConflictError):
        return "SEQUENCE_CONFLICT" if kind == "append" and "seq" in cmd else "CONFLICT"
    if isinstance(exc, MalformedResponseError):
        return "PARSE_ERROR"
    if isinstance(exc, StreamBadRequestError) and kind == "read":
        return "INVALID_OFFSET"
    if exc.status == 0:
        return "NETWORK_ERROR"
    return "UNEXPECTED_STATUS"


def error(kind: str, code: str, message: str, status: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "error",
        "success": False,
        "commandType": kind,
        "errorCode": code,
        "message": message,
    }
    if status:
        out["status"] = status
    return out


def main() -> None:
    adapter = Adapter()
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        try:
            result = adapter.handle(cmd)
        except Exception as exc:  # report, never desync the runner
            result = error(cmd.get("type", "?"), "INTERNAL_ERROR", f"{type(exc).__name__}: {exc}")
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        if cmd.get("type") == "shutdown":
            break


if __name__ == "__main__":
    main()
