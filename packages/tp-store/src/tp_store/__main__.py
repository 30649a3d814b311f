"""``python -m tp_store``: a standalone store server, until SIGINT or SIGTERM.

The argument definitions and the serving loop are reusable: ``tp-rdzv store``
builds on them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence

from .protocol import Limits
from .server import DEFAULT_BACKLOG, StoreServer, new_event_loop


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a store server: address, backlog and request limits."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind ('' for all)")
    parser.add_argument("--port", type=int, default=29400, help="port (0 picks a free one)")
    parser.add_argument("--backlog", type=int, default=DEFAULT_BACKLOG, help="listen backlog")
    defaults = Limits()
    parser.add_argument("--max-key-bytes", type=int, default=defaults.max_key_bytes)
    parser.add_argument("--max-value-bytes", type=int, default=defaults.max_value_bytes)
    parser.add_argument("--max-keys-per-request", type=int, default=defaults.max_keys_per_request)


def server_from_arguments(args: argparse.Namespace) -> StoreServer:
    """The server the options of :func:`add_server_arguments` describe (``ValueError`` if bad)."""
    limits = Limits(args.max_key_bytes, args.max_value_bytes, args.max_keys_per_request)
    return StoreServer(args.host, args.port, backlog=args.backlog, limits=limits)


def serve(server: StoreServer, on_ready: Callable[[StoreServer], None]) -> None:
    """Serve until SIGINT or SIGTERM, calling ``on_ready`` once listening.

    Raises ``OSError`` when the address cannot be bound.
    """

    async def run() -> None:
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            on_ready(server)
            await stop.wait()
        finally:
            await server.close()

    loop = new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tp_store",
        description="Serve a PyTorch-compatible TCPStore until SIGINT or SIGTERM.",
        epilog="example: python -m tp_store --host 127.0.0.1 --port 29400",
    )
    add_server_arguments(parser)
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        serve(
            server_from_arguments(args),
            lambda server: print(f"listening on {server.endpoint}", flush=True),
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
