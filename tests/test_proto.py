"""Checked-in generated protobuf code matches proto/ (regenerate: scripts/generate_proto.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_generator():  # type: ignore[no-untyped-def]
    path = ROOT / "scripts" / "generate_proto.py"
    spec = importlib.util.spec_from_file_location("generate_proto", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    generator = _load_generator()
    generator.generate(tmp_path)
    for name in generator.GENERATED:
        fresh = (tmp_path / name).read_text()
        checked_in = (generator.OUT_DIR / name).read_text()
        assert fresh == checked_in, (
            f"s2_spark/_proto/{name} is stale: run `python scripts/generate_proto.py`"
        )


def test_messages_coexist_with_other_s2_generated_code() -> None:
    """Our private descriptor pool leaves the default pool to s2-sdk and users' own code."""
    from s2_sdk._generated.s2.v1 import s2_pb2 as sdk_pb2

    from s2_spark._proto import s2_pb2

    ours = s2_pb2.ReadBatch(
        records=[
            s2_pb2.SequencedRecord(
                seq_num=3, timestamp=4, body=b"b", headers=[s2_pb2.Header(name=b"n", value=b"v")]
            )
        ],
        tail=s2_pb2.StreamPosition(seq_num=4, timestamp=4),
    )
    theirs = sdk_pb2.ReadBatch.FromString(ours.SerializeToString())
    assert theirs.records[0].seq_num == 3
    assert theirs.records[0].headers[0].value == b"v"
    assert theirs.tail.seq_num == 4
    assert s2_pb2.ReadBatch is not sdk_pb2.ReadBatch


def test_runtime_floor_is_the_declared_protobuf_floor() -> None:
    """The generated code claims to load on the oldest protobuf that pyproject.toml admits."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [d for d in project["dependencies"] if d.startswith("protobuf")]
    floor = re.search(r">=([\d.]+)", spec)
    assert floor is not None, spec
    generator = _load_generator()
    assert ".".join(map(str, generator.RUNTIME_FLOOR)) == floor.group(1)
