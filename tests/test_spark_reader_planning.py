"""Admission control and partitioning of the Spark reader: pure planning, no Spark session."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from s2_spark.backends.s2 import S2Backend, S2Settings
from s2_spark.spark.options import parse_read_options as _parse_read_options
from s2_spark.spark.partitions import (
    DEFAULT_MAX_STREAMS_PER_PARTITION,
    DEFAULT_PACK_RECORDS,
    RANGE_COST,
    PackedPartition,
    RangePartition,
    fair_share,
    pack_ranges,
    split_ranges,
)
from s2_spark.spark.s2.source import S2_READ_FORMAT

BACKEND = S2Backend(S2Settings(basin="unused-basin"))
pending_maps = st.dictionaries(st.text("abcdef", min_size=1, max_size=3),
                               st.integers(0, 50), max_size=6)


def test_fair_share_examples() -> None:
    assert fair_share({"a": 25, "b": 5}, 10) == {"a": 5, "b": 5}
    assert fair_share({"a": 20, "b": 0}, 10) == {"a": 10, "b": 0}
    assert fair_share({"a": 2, "b": 9, "c": 9}, 10) == {"a": 2, "b": 4, "c": 4}
    assert fair_share({"a": 5, "b": 5, "c": 5}, 2) == {"a": 1, "b": 1, "c": 0}
    assert fair_share({}, 10) == {}


@given(pending_maps, st.integers(1, 200))
def test_fair_share_is_max_min_fair(pending: dict[str, int], budget: int) -> None:
    grant = fair_share(pending, budget)
    assert set(grant) == set(pending)
    assert sum(grant.values()) == min(budget, sum(pending.values()))
    assert all(0 <= grant[s] <= pending[s] for s in pending)
    # A stream gets less than another by more than one record only when it has no more.
    for a in pending:
        for b in pending:
            if grant[a] + 1 < grant[b]:
                assert grant[a] == pending[a]
    assert fair_share(pending, budget) == grant  # deterministic


@given(
    st.dictionaries(st.text("xyz", min_size=1, max_size=2),
                    st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=4),
    st.one_of(st.none(), st.integers(1, 20)),
    st.one_of(st.none(), st.integers(1, 100)),
)
def test_split_ranges_cover_exactly(
    spans: dict[str, tuple[int, int]], min_parts: int | None, max_per: int | None
) -> None:
    ranges = {s: (a, a + n, False) for s, (a, n) in spans.items()}
    parts = split_ranges(BACKEND, ranges, min_partitions=min_parts,
                         max_records_per_partition=max_per)
    for stream, (start, end, _) in ranges.items():
        mine = [p for p in parts if p.stream == stream]
        if end == start:
            assert mine == []
            continue
        assert mine[0].start == start and mine[-1].end == end
        assert all(p.start < p.end for p in mine)
        assert all(x.end == y.start for x, y in pairwise(mine))
        if max_per:
            assert all(p.end - p.start <= max_per for p in mine)
    total = sum(n for _, n in spans.values())
    if min_parts and total >= min_parts:
        assert len(parts) >= min_parts


def parse_read_options(options: dict[str, str], *, streaming: bool) -> Any:
    return _parse_read_options(options, streaming=streaming, fmt=S2_READ_FORMAT)


def test_partition_repr_and_options_repr_hide_nothing_secret() -> None:
    p = RangePartition("events", 10, 20)
    assert repr(p) == "RangePartition('events', [10, 20))"
    opts = parse_read_options(
        {"basin": "b", "stream": "s", "accessToken": "tok-very-secret"}, streaming=True)
    assert opts.connection.access_token == "tok-very-secret"
    assert "tok-very-secret" not in repr(opts)
    assert "tok-very-secret" not in repr(S2Backend(S2Settings("b", access_token="tok-very-secret")))


def test_access_token_falls_back_to_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("S2_ACCESS_TOKEN", "from-env")
    assert parse_read_options({"basin": "b", "stream": "s"}, streaming=True) \
        .connection.access_token == "from-env"
    assert parse_read_options({"basin": "b", "stream": "s", "accessToken": "given"},
                              streaming=True).connection.access_token == "given"


@given(
    st.lists(st.integers(1, 3000), max_size=60),
    st.one_of(st.none(), st.integers(1, 30)),
    st.one_of(st.none(), st.integers(1, 5000)),
    st.integers(1, 12),
)
def test_pack_ranges_keeps_every_range_once_in_order_within_bounds(
    sizes: list[int], min_parts: int | None, max_per: int | None, max_streams: int
) -> None:
    parts = [RangePartition(f"s{k:03d}", 0, n) for k, n in enumerate(sizes)]
    packed = pack_ranges(BACKEND, parts, min_partitions=min_parts,
                         max_records_per_partition=max_per, max_streams_per_partition=max_streams)
    groups = [p.ranges if isinstance(p, PackedPartition) else (p,) for p in packed]
    assert [r for g in groups for r in g] == parts
    assert all(len(g) <= max_streams for g in groups)
    for g in groups:
        if len(g) > 1:
            assert isinstance(g, tuple)
            records = sum(r.end - r.start for r in g)
            assert records + RANGE_COST * len(g) <= DEFAULT_PACK_RECORDS
            assert max_per is None or records <= max_per
    if min_parts:
        assert len(packed) >= min(min_parts, len(parts))
    assert pack_ranges(BACKEND, parts, min_partitions=min_parts, max_records_per_partition=max_per,
                       max_streams_per_partition=max_streams) == packed  # deterministic


def test_pack_ranges_examples() -> None:
    small = [RangePartition(f"s{k}", 0, 100) for k in range(1000)]
    sizes = [len(p.ranges) if isinstance(p, PackedPartition) else 1
             for p in pack_ranges(BACKEND, small, min_partitions=None,
                                  max_records_per_partition=None,
                                  max_streams_per_partition=DEFAULT_MAX_STREAMS_PER_PARTITION)]
    assert sizes == [500, 500]  # 100 records + RANGE_COST each, 100,000 per partition
    big = [RangePartition("a", 0, 10), RangePartition("b", 0, 500_000), RangePartition("c", 0, 1)]
    assert pack_ranges(BACKEND, big, min_partitions=None, max_records_per_partition=None,
                       max_streams_per_partition=1000) == big  # a big range stays alone
    assert pack_ranges(BACKEND, small[:3], min_partitions=None, max_records_per_partition=None,
                       max_streams_per_partition=1) == small[:3]  # packing off
    assert pack_ranges(BACKEND, big, min_partitions=3, max_records_per_partition=None,
                       max_streams_per_partition=1000) == big  # minPartitions holds
