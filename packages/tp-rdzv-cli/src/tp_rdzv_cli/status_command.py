"""``tp-rdzv status``: what a rendezvous (or a store server) is doing now."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tp_rdzv_api.config_keys import store_security, tcp_store_security
from tp_rdzv_api.utils import parse_rendezvous_config, parse_rendezvous_endpoint
from tp_rdzv_dynamic.factory import DEFAULT_PORT
from tp_store import StoreError, TCPStore, UnsupportedOperationError

from .connect import (
    add_observer_arguments,
    add_rendezvous_arguments,
    open_handler,
    open_torch_c10d_run,
    rendezvous_errors,
)
from .errors import CommandError, ExitCode
from .options import positive_seconds
from .stop import StopSignals

EXAMPLES = """examples:
  tp-rdzv status --endpoint 127.0.0.1:29400 --run-id job1
  tp-rdzv status --endpoint 127.0.0.1:29400 --run-id job1 --json
  tp-rdzv status --endpoint 127.0.0.1:29400 --run-id job1 --watch
  tp-rdzv status --endpoint 127.0.0.1:29400 --store      # the store server's counters
  tp-rdzv status --endpoint node0:29400 --store --config tls_ca=ca.pem,secret_file=s

On a store with sessions (ours) a node is "present": the steward watches it
through its store session and the store reports its end. Otherwise heartbeat
ages are measured by the steward on its own clock at its last tick (at most
one keep_alive_interval ago), so skewed clocks do not distort them.
With --backend c10d, a torchrun job's state (PyTorch's own c10d rendezvous)
is shown when the store holds one; its heartbeat ages come from the nodes'
wall clocks. A run with nothing stored is an error (exit 1), or with --watch
a "does not exist (yet)" line. Status never writes to the store.
The --json document follows the schema in tp_rdzv_cli/status.schema.json."""


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``status``."""
    parser = commands.add_parser(
        "status",
        parents=parents,
        help="show a rendezvous: round, participants, wait list, liveness",
        description="Show the state of a rendezvous, or with --store the store server's counters.",
        epilog=EXAMPLES,
    )
    add_rendezvous_arguments(parser, run_id_required=False)
    add_observer_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--watch", action="store_true", help="refresh until Ctrl-C (SIGINT) or SIGTERM"
    )
    parser.add_argument(
        "--interval",
        type=positive_seconds,
        default=1.0,
        help="seconds between refreshes (default 1)",
    )
    parser.add_argument(
        "--store", action="store_true", help="show the store server's counters instead"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Show the status once, or until interrupted with ``--watch``."""
    if args.store:
        read = _store_reader(args)
    elif not args.run_id:
        raise CommandError("--run-id is required (or --store for the server)", ExitCode.USAGE)
    else:
        read = _rendezvous_reader(args)
    render: Callable[[dict[str, Any]], RenderableType] = (
        _store_table if args.store else _rendezvous_view
    )
    console = Console()
    if not args.watch:
        document = read()
        if not document.get("exists", True):
            raise CommandError(_missing_run(document, args.endpoint), ExitCode.FAILED)
        if args.json:
            print(json.dumps(document), flush=True)
        else:
            console.print(render(document))
        return ExitCode.OK
    with StopSignals() as stop:
        try:
            if args.json:
                while True:
                    print(json.dumps(read()), flush=True)
                    if stop.wait(args.interval):
                        break
            else:
                with Live(render(read()), console=console, auto_refresh=False) as live:
                    while not stop.wait(args.interval):
                        live.update(render(read()), refresh=True)
        except KeyboardInterrupt:  # a second signal, to break out of a call that hangs
            pass
    return ExitCode.OK


def _rendezvous_reader(args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    handler = open_handler(args, observer=True)
    torch_run = open_torch_c10d_run(args)

    def read() -> dict[str, Any]:
        with rendezvous_errors():
            found = None if torch_run is None else torch_run.read()
            if torch_run is not None and found is not None:
                status = torch_run.status(found[0])
            else:
                status = handler.status()
        return {**status.to_dict(), "observed_at": time.time()}

    return read


def _store_reader(args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    try:
        host, port = parse_rendezvous_endpoint(args.endpoint, default_port=DEFAULT_PORT)
    except ValueError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    try:
        config = parse_rendezvous_config(args.config)
    except ValueError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    # The client's TLS and secret keys of the rendezvous config (the secret
    # may also come from TP_STORE_SECRET or TP_STORE_SECRET_FILE).
    try:
        store = TCPStore(
            host,
            port,
            timeout=args.timeout,
            **tcp_store_security(store_security(config), master=False),
        )
    except ValueError as exc:
        raise CommandError(str(exc), ExitCode.USAGE) from exc
    except (StoreError, OSError) as exc:
        raise CommandError(
            f"cannot reach the store at {args.endpoint}: {exc}", ExitCode.UNREACHABLE
        ) from exc

    def read() -> dict[str, Any]:
        try:
            return dict(store.server_stats())
        except UnsupportedOperationError as exc:
            raise CommandError(str(exc), ExitCode.FAILED) from exc
        except StoreError as exc:
            raise CommandError(
                f"the store at {args.endpoint} failed: {exc}", ExitCode.UNREACHABLE
            ) from exc

    return read


# -- rendering ---------------------------------------------------------------------


def _liveness(node: dict[str, Any]) -> str:
    if node.get("present"):
        return "present"
    age = node["heartbeat_age"]
    return "-" if age is None else f"heartbeat {age:.1f} s ago"


def _missing_run(document: dict[str, Any], endpoint: str) -> str:
    return (
        f"rendezvous {document['run_id']!r} does not exist on {endpoint} (backend "
        f"{document['backend']}): nothing is stored for it"
    )


def _rendezvous_view(document: dict[str, Any]) -> RenderableType:
    if not document["exists"]:
        return Text(f"run {document['run_id']} ({document['backend']}): does not exist (yet)")
    phase = "closed" if document["closed"] else "complete" if document["complete"] else "forming"
    steward = document["steward"] or "vacant"
    header = Text.assemble(
        ("run ", "dim"),
        (document["run_id"], "bold"),
        (f" ({document['backend']})  round ", "dim"),
        (str(document["round"]), "bold"),
        "  ",
        (phase, "bold green" if phase == "complete" else "bold yellow"),
        ("  steward ", "dim"),
        f"{steward} (epoch {document['steward_epoch']})",
    )
    parts: list[RenderableType] = [header, _node_table("participants", document["participants"])]
    for name in ("wait_list", "redundancy_list"):
        if document[name]:
            parts.append(_node_table(name.replace("_", " "), document[name]))
    return Group(*parts)


def _node_table(title: str, nodes: list[dict[str, Any]]) -> Table:
    table = Table(title=f"{title} ({len(nodes)})", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("node")
    table.add_column("liveness", justify="right")
    for node in nodes:
        rank = node["rank"]
        # Text, not markup: a node may be named "[/]x".
        table.add_row("-" if rank is None else str(rank), Text(node["node"]), _liveness(node))
    return table


def _store_table(document: dict[str, Any]) -> RenderableType:
    table = Table(title="store server", title_justify="left")
    table.add_column("counter")
    table.add_column("value", justify="right")
    for name, value in document.items():
        if name != "ops":
            table.add_row(Text(name), Text(str(value)))
    busy = {op: count for op, count in document.get("ops", {}).items() if count}
    for op, count in sorted(busy.items(), key=lambda item: -item[1]):
        table.add_row(Text(f"ops.{op}"), Text(str(count)))
    return table
