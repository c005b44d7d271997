"""`python -m s2_spark.testing.external build s2-lite|kafka`: build the pinned server into the
cache unless it is there already, and print the binary's path (the test command runs this
before the suite, so a first build is not charged to a test's timeout)."""

from __future__ import annotations

import argparse
import sys
import time

from s2_spark.testing.external._process import ExternalServerError, Pinned
from s2_spark.testing.external.kafka import KAFKA
from s2_spark.testing.external.s2_lite import S2_LITE

PINNED: dict[str, Pinned] = {S2_LITE.name: S2_LITE, KAFKA.name: KAFKA}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m s2_spark.testing.external")
    parser.add_argument("action", choices=["build", "path"])
    parser.add_argument("server", choices=sorted(PINNED))
    args = parser.parse_args(argv)
    pinned = PINNED[args.server]
    if args.action == "path":
        print(pinned.path)
        return 0
    if not pinned.path.is_file():
        print(f"building {pinned.name} {pinned.version} into {pinned.folder} "
              f"(first time only)", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        path = pinned.ensure_built(log=sys.stderr)
    except ExternalServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{pinned.name} {pinned.version}: {path} ({time.monotonic() - started:.0f} s)",
          file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
