"""``tp-rdzv join``: one node's agent loop.

Join, print the round, keep heartbeating (the handler does) and join again
whenever the round stops describing the job (a node died, left or waits to
join), until the rendezvous closes. The wait is event-driven: the steward marks
a round stale and the agent wakes on that key.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from tp_rdzv_api import RendezvousClosedError, RendezvousGracefulExitError, RendezvousInfo

from .connect import add_rendezvous_arguments, open_handler, rendezvous_errors
from .errors import ExitCode
from .options import MAX_NODES, integer

EXAMPLES = """examples:
  tp-rdzv join --endpoint 127.0.0.1:29400 --run-id job1 --min 2 --max 4
  tp-rdzv join --endpoint node0:29400 --run-id job1 --min 2 --max 4 --json \\
      --config keep_alive_interval=1,last_call_timeout=2

Output: one line per round (rank, world size, participants); with --json, one
JSON object per line with "event" = "round", "closed" or "spare_released".
It exits 0 when the rendezvous closes."""

#: How long one wait for a change lasts before it is renewed (no work is done then).
_WATCH_SECONDS = 30.0


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``join``."""
    parser = commands.add_parser(
        "join",
        parents=parents,
        help="join a rendezvous and follow its rounds until it closes",
        description="Join a rendezvous as one node and re-join whenever membership changes.",
        epilog=EXAMPLES,
    )
    add_rendezvous_arguments(parser)
    nodes = integer(1, MAX_NODES)
    parser.add_argument("--min", type=nodes, required=True, dest="min_nodes", help="min nodes")
    parser.add_argument("--max", type=nodes, required=True, dest="max_nodes", help="max nodes")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Follow the rendezvous until it closes."""
    handler = open_handler(args, min_nodes=args.min_nodes, max_nodes=args.max_nodes)
    node = str(handler.node)

    def emit(event: str, text: str, **fields: Any) -> None:
        if args.json:
            print(json.dumps({"event": event, "node": node, **fields}), flush=True)
        else:
            print(text, flush=True)

    with rendezvous_errors():
        try:
            while True:
                started = time.monotonic()
                info = handler.next_rendezvous()
                _report(emit, handler.round, info, time.monotonic() - started)
                while not handler.wait_for_change(_WATCH_SECONDS):
                    pass
        except RendezvousClosedError:
            emit("closed", "the rendezvous is closed")
        except RendezvousGracefulExitError:
            emit("spare_released", "the rendezvous closed while this node was a spare")
        # Closed already, so this only stops the threads; on any other way out
        # the node just leaves (shutting down would close the job for all).
        handler.shutdown()
    return ExitCode.OK


def _report(
    emit: Callable[..., None], round_: int | None, info: RendezvousInfo, seconds: float
) -> None:
    participants = [str(node) for node in info.participants]
    emit(
        "round",
        f"round {round_}: rank {info.rank} of {info.world_size} "
        f"({seconds:.2f} s); participants: {', '.join(participants)}",
        round=round_,
        rank=info.rank,
        world_size=info.world_size,
        participants=participants,
        wait_list=[str(node) for node in info.wait_list],
        seconds=round(seconds, 3),
    )
