"""``python -m tp_store``: a standalone store server, until SIGINT or SIGTERM.

The argument definitions and the serving loop are reusable: ``tp-rdzv store``
builds on them. The secret is never an argument (the process list shows
arguments to every user): ``--secret-file``, or the environment's
``TP_STORE_SECRET`` or ``TP_STORE_SECRET_FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence

from .protocol import Limits
from .security import SECRET_ENV, SECRET_FILE_ENV, load_secret, server_ssl_context
from .server.store_server import (
    DEFAULT_BACKLOG,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_REQUEST_TIMEOUT,
    StoreServer,
    new_event_loop,
)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a store server: address, backlog, limits, TLS and the secret file."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind ('' for all)")
    parser.add_argument("--port", type=int, default=29400, help="port (0 picks a free one)")
    parser.add_argument(
        "--backlog", type=int, default=DEFAULT_BACKLOG, help="listen backlog (default %(default)s)"
    )
    defaults = Limits()
    limits = parser.add_argument_group("limits (a request over one closes its connection)")
    limits.add_argument(
        "--max-key-bytes",
        type=int,
        default=defaults.max_key_bytes,
        help="bytes of one key at most (default %(default)s)",
    )
    limits.add_argument(
        "--max-value-bytes",
        type=int,
        default=defaults.max_value_bytes,
        help="bytes of one value at most, appends included (default %(default)s)",
    )
    limits.add_argument(
        "--max-keys-per-request",
        type=int,
        default=defaults.max_keys_per_request,
        help="keys one request may name at most (default %(default)s)",
    )
    limits.add_argument(
        "--max-keys",
        type=int,
        default=defaults.max_keys,
        help="keys and queued values stored at most (default %(default)s)",
    )
    limits.add_argument(
        "--max-stored-bytes",
        type=int,
        default=defaults.max_stored_bytes,
        help="bytes of all stored keys and values at most (default %(default)s)",
    )
    limits.add_argument(
        "--max-message-bytes",
        type=int,
        default=defaults.max_message_bytes,
        help="bytes of one request or reply at most (default %(default)s)",
    )
    limits.add_argument(
        "--max-session-keys",
        type=int,
        default=defaults.max_session_keys,
        help="keys one store session may own at most (default %(default)s)",
    )
    limits.add_argument(
        "--max-session-wills",
        type=int,
        default=defaults.max_session_wills,
        help="wills one store session may hold at most (default %(default)s)",
    )
    limits.add_argument(
        "--max-connections",
        type=int,
        help="open connections at most; more are closed at once (default: as many as "
        f"the open-file limit allows, raised to the hard limit, up to {DEFAULT_MAX_CONNECTIONS})",
    )
    limits.add_argument(
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT,
        help="seconds a request, the TLS handshake or authentication may take to arrive "
        "whole (idle and waiting connections are never timed out; default %(default)s)",
    )
    limits.add_argument(
        "--memory-budget",
        type=int,
        default=DEFAULT_MEMORY_BUDGET,
        help="bytes held for all clients at most (requests being received, unread replies, "
        "parked waits); over it the biggest holders are dropped (default %(default)s)",
    )
    security = parser.add_argument_group(
        "security (off by default)",
        f"The secret comes from --secret-file, or ${SECRET_ENV}, or ${SECRET_FILE_ENV}; "
        "never from an argument. With one, PyTorch clients are refused.",
    )
    security.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate")
    security.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    security.add_argument(
        "--tls-client-ca", metavar="PEM", help="require client certificates signed by this CA"
    )
    security.add_argument(
        "--secret-file", metavar="PATH", help="require clients to prove the secret in this file"
    )
    # Without it, argparse would take "--secret VALUE" as an abbreviation of
    # --secret-file: say plainly instead that a secret is never an argument.
    security.add_argument("--secret", action=_RefuseSecretArgument, help=argparse.SUPPRESS)


class _RefuseSecretArgument(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"a secret is never a command-line argument (every user can read those): use "
            f"--secret-file, ${SECRET_ENV} or ${SECRET_FILE_ENV}"
        )


def server_from_arguments(args: argparse.Namespace) -> StoreServer:
    """The server the options of :func:`add_server_arguments` describe (``ValueError`` if bad,
    including TLS files that cannot be loaded and an unreadable secret file)."""
    limits = Limits(
        args.max_key_bytes,
        args.max_value_bytes,
        args.max_keys_per_request,
        args.max_keys,
        args.max_message_bytes,
        args.max_session_keys,
        args.max_session_wills,
        max_stored_bytes=args.max_stored_bytes,
    )
    if args.tls_cert is None and (args.tls_key is not None or args.tls_client_ca is not None):
        raise ValueError("--tls-key and --tls-client-ca need --tls-cert")
    context = (
        None
        if args.tls_cert is None
        else server_ssl_context(args.tls_cert, args.tls_key, args.tls_client_ca)
    )
    return StoreServer(
        args.host,
        args.port,
        backlog=args.backlog,
        limits=limits,
        ssl=context,
        secret=load_secret(secret_file=args.secret_file),
        max_connections=args.max_connections,
        request_timeout=args.request_timeout,
        memory_budget=args.memory_budget,
    )


def serve(server: StoreServer, on_ready: Callable[[StoreServer], None]) -> None:
    """Serve until SIGINT or SIGTERM, calling ``on_ready`` once listening.

    The first SIGINT or SIGTERM starts the orderly shutdown; later ones are
    ignored, also after this returns: supervisors and ``timeout(1)`` may send a
    second signal milliseconds after the first, and its default action would
    kill the process on its way out. Call it from the main thread. Raises
    ``OSError`` when the address cannot be bound.
    """
    loop = new_event_loop()
    stop = asyncio.Event()

    def request_stop(signum: int, frame: object) -> None:
        loop.call_soon_threadsafe(stop.set)

    # Not loop.add_signal_handler: closing the loop would put the default action
    # back, and so would the interpreter's exit for a Python handler; SIG_IGN stays.
    for signum in _STOP_SIGNALS:
        signal.signal(signum, request_stop)

    async def run() -> None:
        await server.start()
        try:
            on_ready(server)
            await stop.wait()
        finally:
            await server.close()

    try:
        loop.run_until_complete(run())
    finally:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        loop.close()


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid level {text!r} (choose from {', '.join(_LOG_LEVELS)})"
        )
    return level


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tp_store",
        description="Serve a PyTorch-compatible TCPStore until SIGINT or SIGTERM.",
        epilog="example: python -m tp_store --host 127.0.0.1 --port 29400",
    )
    add_server_arguments(parser)
    parser.add_argument(
        "--log-level",
        type=_log_level,
        default="WARNING",
        help=f"logging level: {', '.join(_LOG_LEVELS)} (default WARNING)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
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
