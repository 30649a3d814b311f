"""``tp-rdzv close``: close a rendezvous; its nodes' agents then exit."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from .connect import (
    add_observer_arguments,
    add_rendezvous_arguments,
    open_handler,
    rendezvous_errors,
)
from .errors import ExitCode

EXAMPLES = """examples:
  tp-rdzv close --endpoint 127.0.0.1:29400 --run-id job1

Nodes waiting for a round are refused (spares leave gracefully), and every
`tp-rdzv join` of the run exits 0. Closing a closed rendezvous is fine."""


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``close``."""
    parser = commands.add_parser(
        "close",
        parents=parents,
        help="close a rendezvous",
        description="Close a rendezvous: no new rounds; its agents exit.",
        epilog=EXAMPLES,
    )
    add_rendezvous_arguments(parser)
    add_observer_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Close the run."""
    handler = open_handler(args, observer=True)
    with rendezvous_errors():
        handler.set_closed()
    if args.json:
        print(json.dumps({"event": "closed", "run_id": args.run_id}), flush=True)
    else:
        print(f"rendezvous {args.run_id!r} is closed", flush=True)
    return ExitCode.OK
