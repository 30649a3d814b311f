"""``tp-rdzv store``: a standalone store server, optionally with Prometheus metrics."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from tp_store.__main__ import add_server_arguments, serve, server_from_arguments
from tp_store.server.store_server import StoreServer

from .errors import CommandError, ExitCode
from .options import port

EXAMPLES = """examples:
  tp-rdzv store --port 29400                   # on loopback
  tp-rdzv store --host 0.0.0.0 --port 29400    # for the whole cluster
  tp-rdzv store --port 0 --json                # a free port, endpoint as JSON
  tp-rdzv store --port 29400 --metrics-port 9400   # Prometheus at :9400/metrics
  TP_STORE_SECRET_FILE=/etc/tp/secret tp-rdzv store --host 0.0.0.0 \\
      --tls-cert node.pem --tls-key node.key --tls-client-ca ca.pem   # TLS + secret

It prints its endpoint once listening and serves until SIGINT or SIGTERM.
Nodes then need the same secret and TLS files: join/status/close take them as
--config keys (tls_ca=ca.pem,tls_cert=node.pem,tls_key=node.key,secret_file=...)
or the secret from TP_STORE_SECRET / TP_STORE_SECRET_FILE. PyTorch clients
cannot use a store that has a secret or TLS."""


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``store``."""
    parser = commands.add_parser(
        "store",
        parents=parents,
        help="run a standalone store server",
        description="Serve a rendezvous store (PyTorch TCPStore protocol) until SIGINT/SIGTERM.",
        epilog=EXAMPLES,
    )
    add_server_arguments(parser)
    parser.add_argument(
        "--metrics-port",
        type=port,
        default=None,
        help="serve Prometheus metrics on this port (needs tp-rdzv-cli[metrics])",
    )
    parser.add_argument(
        "--metrics-host", default=None, help="address of the metrics endpoint (default: --host)"
    )
    parser.add_argument("--json", action="store_true", help="print the endpoint as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until stopped."""
    try:
        server = server_from_arguments(args)
    except ValueError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    stoppers = []

    def ready(server: StoreServer) -> None:
        document: dict[str, Any] = {
            "event": "listening",
            "endpoint": server.endpoint,
            "tls": server.ssl is not None,
            "secret_required": server.secret is not None,
        }
        if args.metrics_port is not None:
            from .metrics import serve_metrics  # noqa: PLC0415 - prometheus is optional

            host = args.metrics_host if args.metrics_host is not None else args.host
            exporter = serve_metrics(args.metrics_port, host, server.stats)
            stoppers.append(exporter.stop)
            document["metrics"] = f"http://{host or '0.0.0.0'}:{exporter.port}/metrics"
        if args.json:
            print(json.dumps(document), flush=True)
        else:
            extra = "".join(
                (
                    " (TLS)" if document["tls"] else "",
                    " (secret required)" if document["secret_required"] else "",
                    f"; metrics at {document['metrics']}" if "metrics" in document else "",
                )
            )
            print(f"store listening on {server.endpoint}{extra}", flush=True)

    try:
        serve(server, ready)
    except OSError as exc:
        raise CommandError(
            f"cannot serve on {args.host}:{args.port}: {exc}", ExitCode.FAILED
        ) from exc
    finally:
        for stop in stoppers:
            stop()
    return ExitCode.OK
