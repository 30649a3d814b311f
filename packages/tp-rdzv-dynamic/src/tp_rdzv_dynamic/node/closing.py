"""Closing a run: recorded in the state by one node, then told to every waiting node."""

from __future__ import annotations

import time

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousTimeoutError,
)
from tp_rdzv_dynamic.backends.holder import _RendezvousStateHolder
from tp_rdzv_dynamic.documents.board import RendezvousBoard
from tp_rdzv_dynamic.model.decisions import Close, apply
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.settings import RendezvousSettings


def close_run(
    node: _NodeDesc,
    settings: RendezvousSettings,
    board: RendezvousBoard,
    holder: _RendezvousStateHolder,
) -> int | None:
    """Close the run; the round it closed at, or ``None`` if another node did (or does).

    The state is closed first and the ``closed`` key set last, so a node that
    finds the key knows the state is closed and has nothing to do: every node
    of a job may shut down without rewriting the state.
    """
    if board.is_closed():
        return None
    # Every agent shuts down at the end of a job: one of them records the
    # closing, the others wait for its mark instead of racing to rewrite
    # the whole state (and record it themselves if that node vanished).
    close_timeout = settings.timeout.close.total_seconds()
    if not board.claim_closing(node) and board.await_closed(close_timeout):
        return None
    state, token = holder.load()
    deadline = time.monotonic() + close_timeout
    while True:
        closing = apply(state, [Close()], settings)
        if state.closed:
            break
        if time.monotonic() > deadline:
            raise RendezvousTimeoutError(
                f"rendezvous {board.run_id!r}: could not record the closing within "
                f"the close timeout ({settings.timeout.close})"
            )
        state, token, _ = holder.save(closing.state, token)
    # Wake the nodes waiting for a round, and the agents watching the completed one.
    for outcome in closing.outcomes:
        board.publish(outcome)
    if state.complete:
        board.mark_stale(state.round)
    board.close()
    return state.round


def closed_error(node: _NodeDesc, run_id: str, holder: _RendezvousStateHolder) -> RendezvousError:
    """What ``node`` raises on finding the run closed: a spare leaves gracefully, others fail."""
    state, _ = holder.load()
    if node in state.redundancy_list:
        return RendezvousGracefulExitError(
            f"the rendezvous {run_id!r} closed while {node} was a spare"
        )
    return RendezvousClosedError(f"the rendezvous {run_id!r} is closed")
