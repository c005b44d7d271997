"""Regenerate s2_spark/_proto from proto/ with grpcio-tools' bundled protoc.

Run `python scripts/generate_proto.py` after editing a .proto file;
tests/test_proto.py fails when the checked-in code is stale.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTO_FILE = PROTO_ROOT / "s2" / "v1" / "s2.proto"
OUT_DIR = ROOT / "s2_spark" / "_proto"
GENERATED = ("s2_pb2.py", "s2_pb2.pyi")
RUNTIME_FLOOR = (5, 27, 0)  # keep in step with protobuf's lower bound in pyproject.toml


def generate(out_dir: Path) -> None:
    """Write s2_pb2.py and s2_pb2.pyi for proto/s2/v1/s2.proto into out_dir."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            str(PROTO_FILE),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_FILE}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            text = (Path(tmp) / "s2" / "v1" / name).read_text()
            if name.endswith(".py"):
                text = _runtime_floor(_private_pool(text))
            (out_dir / name).write_text(text)


def _private_pool(text: str) -> str:
    """Register the messages in a pool of our own, not protobuf's process-wide default.

    Other S2 code (s2-sdk, users' own generated code) registers the same file and
    message names; sharing the default pool would make the second import fail.
    """
    default = "_descriptor_pool.Default().AddSerializedFile("
    if text.count(default) != 1:
        raise RuntimeError("unexpected protoc output: cannot find the descriptor pool call")
    return text.replace(
        default, "_descriptor_pool.DescriptorPool().AddSerializedFile(", 1
    )


def _runtime_floor(text: str) -> str:
    """Stamp the code with the oldest protobuf runtime it supports, not protoc's version.

    protoc writes its own version into the code, and protobuf refuses to load code stamped
    newer than the runtime. What it generates for these messages (a serialized descriptor
    built through `builder`) loads on every runtime since 5.27.0, the first with the
    `runtime_version` module and the floor declared in pyproject.toml; the lowest-versions
    run of scripts/version_matrix.py proves it.
    """
    stamp = re.compile(r"(_runtime_version\.Domain\.PUBLIC,\s*)(\d+),\s*(\d+),\s*(\d+),")
    if len(stamp.findall(text)) != 1:
        raise RuntimeError("unexpected protoc output: cannot find the runtime version check")
    major, minor, patch = RUNTIME_FLOOR
    return stamp.sub(rf"\g<1>{major},\n    {minor},\n    {patch},", text, count=1)


if __name__ == "__main__":
    generate(OUT_DIR)
    print(f"generated {', '.join(GENERATED)} in {OUT_DIR.relative_to(ROOT)}", file=sys.stderr)
