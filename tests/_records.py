"""Reading back what a test wrote: every data record of a stream, in order."""

from __future__ import annotations

from typing import Any

#: A data record as tests compare it: body, headers as (name, value) pairs, timestamp (ms).
Rec = tuple[bytes, list[tuple[bytes, bytes]], int]


def data_records(stream: Any) -> list[Rec]:
    """Every data record of `stream` (a client `Stream`; command records left out) up to
    its tail now, in order."""
    tail = stream.check_tail().seq_num
    out: list[Rec] = []
    pos = 0
    while pos < tail:
        d = stream.read(seq_num=pos, count=min(1000, tail - pos), include_command_records=False)
        if d.count == 0:
            break
        for r in d.batch.to_pylist():
            ts = r["timestamp"]
            ms = int(ts.timestamp() * 1000) if hasattr(ts, "timestamp") else int(ts)
            out.append((r["body"], [(h["name"], h["value"]) for h in r["headers"]], ms))
        pos = int(d.last_seq_num) + 1
    return out
