"""CLI: `python -m s2_spark.testing --host H --port P [--data-dir D] [--token T]
[--heartbeat-interval LOW[,HIGH]] [--deletion-delay SECONDS]
[--tls-cert CERT --tls-key KEY [--tls-client-ca CA]] [--http-stack auto|granian|hypercorn]`.

Prints the server URL on its own line once it accepts connections. The token may also
come from the S2_LOCAL_SERVER_TOKEN environment variable (kept out of `ps` output).
"""

from __future__ import annotations

import argparse
import logging
import os

from s2_spark.testing.semantics.read import HEARTBEAT_INTERVAL, HeartbeatInterval, heartbeat_range
from s2_spark.testing.serving.server import ServerTls, serve_forever


def _interval(text: str) -> HeartbeatInterval:
    try:
        parts = [float(p) for p in text.split(",")]
        if len(parts) not in (1, 2):
            raise ValueError(text)
        return heartbeat_range((parts[0], parts[-1]))
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"expected seconds or LOW,HIGH with 0 < LOW <= HIGH (got {text!r})") from e


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m s2_spark.testing", description="Local S2-compatible server."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--data-dir", default=None, help="journal directory (default: memory)")
    parser.add_argument("--token", default=None, help="require `Authorization: Bearer TOKEN`")
    parser.add_argument(
        "--heartbeat-interval", type=_interval, default=HEARTBEAT_INTERVAL,
        help="seconds between read-session heartbeats, fixed or LOW,HIGH drawn at random "
        "(default 5,15, as s2-lite)")
    parser.add_argument("--deletion-delay", type=float, default=0.0,
                        help="seconds a deleted stream or basin stays deletion pending "
                        "before it is removed (default 0: at once, as s2-lite)")
    parser.add_argument("--tls-cert", default=None, help="serve HTTPS with this PEM chain")
    parser.add_argument("--tls-key", default=None, help="the private key of --tls-cert")
    parser.add_argument("--tls-client-ca", default=None,
                        help="require client certificates signed by a CA in this PEM file")
    parser.add_argument("--http-stack", default="auto", choices=["auto", "granian", "hypercorn"],
                        help="the HTTP stack (auto: granian where installed, else hypercorn)")
    args = parser.parse_args(argv)
    # The stack chosen, and why, on stderr (stdout carries the URL).
    log = logging.getLogger("s2_spark.testing.server")
    log.setLevel(logging.INFO)
    log.addHandler(logging.StreamHandler())
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_client_ca is not None and args.tls_cert is None:
        parser.error("--tls-client-ca needs --tls-cert and --tls-key")
    tls = (None if args.tls_cert is None
           else ServerTls(args.tls_cert, args.tls_key, args.tls_client_ca))
    token = args.token if args.token is not None else os.environ.get("S2_LOCAL_SERVER_TOKEN")
    serve_forever(
        args.host,
        args.port,
        data_dir=args.data_dir,
        token=token,
        heartbeat_interval=args.heartbeat_interval,
        tls=tls,
        deletion_delay=args.deletion_delay,
        stack=args.http_stack,
    )


if __name__ == "__main__":
    main()
