"""``python -m tp_store``: a standalone store server, until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from .protocol import Limits
from .server import DEFAULT_BACKLOG, StoreServer, new_event_loop


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tp_store",
        description="Serve a PyTorch-compatible TCPStore until SIGINT or SIGTERM.",
        epilog="example: python -m tp_store --host 127.0.0.1 --port 29400",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind ('' for all)")
    parser.add_argument("--port", type=int, default=29400, help="port (0 picks a free one)")
    parser.add_argument("--backlog", type=int, default=DEFAULT_BACKLOG, help="listen backlog")
    defaults = Limits()
    parser.add_argument("--max-key-bytes", type=int, default=defaults.max_key_bytes)
    parser.add_argument("--max-value-bytes", type=int, default=defaults.max_value_bytes)
    parser.add_argument("--max-keys-per-request", type=int, default=defaults.max_keys_per_request)
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    return parser


async def _serve(server: StoreServer) -> None:
    await server.start()
    print(f"listening on {server.endpoint}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        limits = Limits(args.max_key_bytes, args.max_value_bytes, args.max_keys_per_request)
        server = StoreServer(args.host, args.port, backlog=args.backlog, limits=limits)
        loop = new_event_loop()
        try:
            loop.run_until_complete(_serve(server))
        finally:
            loop.close()
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
