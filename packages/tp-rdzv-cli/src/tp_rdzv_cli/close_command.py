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
    open_torch_c10d_run,
    rendezvous_errors,
)
from .errors import ExitCode

EXAMPLES = """examples:
  tp-rdzv close --endpoint 127.0.0.1:29400 --run-id job1

Nodes waiting for a round are refused (spares leave gracefully), and every
`tp-rdzv join` of the run exits 0. Closing a closed rendezvous is fine.
With --backend c10d, a torchrun job (PyTorch's own c10d rendezvous) is closed
in PyTorch's state, as PyTorch's set_closed does: no restarts or new nodes;
its agents exit when their workers finish (waiting ones at once)."""


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
    """Close the run: PyTorch's c10d state when ``--backend c10d`` finds one, else ours."""
    torch_run = open_torch_c10d_run(args)
    with rendezvous_errors():
        if torch_run is not None and torch_run.read() is not None:
            torch_run.close(args.timeout)
        else:
            open_handler(args, observer=True).set_closed()
    if args.json:
        print(json.dumps({"event": "closed", "run_id": args.run_id}), flush=True)
    else:
        print(f"rendezvous {args.run_id!r} is closed", flush=True)
    return ExitCode.OK
