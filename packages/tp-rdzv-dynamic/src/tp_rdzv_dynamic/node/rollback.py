"""Giving up a join that timed out: the node withdraws it, and learns which error to raise."""

from __future__ import annotations

import itertools
import logging

from tp_rdzv_api import RendezvousError, RendezvousExhaustedError, RendezvousTimeoutError
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.events import log_event
from tp_rdzv_dynamic.model.decisions import Leave
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.settings import RendezvousSettings

log = logging.getLogger(__name__)

#: How long a node rolling back a timed-out join waits for the steward's receipt.
_ROLLBACK_GRACE = 5.0
_receipts = itertools.count()


def roll_back_join(
    node: _NodeDesc, settings: RendezvousSettings, board: RendezvousBoard, round_: int | None
) -> RendezvousError:
    """Withdraw ``node``'s join (a leave the steward confirms); the error to raise.

    ``round_`` is the last round the node completed, for the log records.
    """
    run_id = board.run_id
    gathered = board.pending()
    receipt = board.keys.new_receipt(node.key, next(_receipts))
    board.post(Leave(node), receipt)
    grace = min(_ROLLBACK_GRACE, settings.timeout.close.total_seconds())
    if not board.await_receipt(receipt, grace):
        log_event(
            log,
            logging.WARNING,
            "rollback_unconfirmed",
            f"no steward confirmed that {node} left; it will be dropped when its heartbeats stop",
            run_id=run_id,
            node=node,
            round_=round_,
        )
    timeout = settings.timeout.join
    log_event(
        log,
        logging.WARNING,
        "join_timeout",
        f"{node} gave up after the join timeout",
        run_id=run_id,
        node=node,
        round_=round_,
    )
    if 0 < gathered < settings.min_nodes:
        return RendezvousExhaustedError(
            {"min_nodes": settings.min_nodes, "joined": gathered, "run_id": run_id}, timeout
        )
    return RendezvousTimeoutError(
        f"rendezvous {run_id!r}: {node} did not get a seat within the join timeout ({timeout})"
    )
