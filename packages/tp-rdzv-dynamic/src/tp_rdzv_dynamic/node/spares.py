"""The join timeout of a waiting node, which spares are exempt from (as in PyTorch).

A spare is a node in the redundancy list: it joined when a round was already
complete with ``max_nodes``, and waits for a participant to leave. It may
wait for hours, and must not give up at the join timeout: when a participant
dies it is the node that takes its place. PyTorch exempts it while it is in
the redundancy list and starts a whole join timeout when it leaves it.

A waiting node does not learn the moment it stops being a spare: it reads the
state once each time its deadline passes (one round trip per join timeout,
none per tick). A spare gets a new join timeout, and so does a node that was
a spare at the last look and is not now: it left the redundancy list during
the last join timeout, and so it gets between one and two join timeouts after
that moment, never less than PyTorch gives it.
"""

from __future__ import annotations

from datetime import timedelta

from tp_rdzv_dynamic.backends.holder import _RendezvousStateHolder
from tp_rdzv_dynamic.model.node_desc import _NodeDesc


class JoinDeadline:
    """When a node waiting for a seat gives up.

    Args:
        node: the waiting node.
        holder: where its state is read when the deadline passes.
        join: the join timeout.
        now: when the node posted its join (monotonic seconds).
    """

    def __init__(
        self, node: _NodeDesc, holder: _RendezvousStateHolder, join: timedelta, now: float
    ) -> None:
        self._node = node
        self._holder = holder
        self._join = join.total_seconds()
        self._at = now + self._join
        self._spare = False  # whether the node was a spare at the last look

    def remaining(self, now: float) -> float:
        """Seconds left before the next look (at least 0)."""
        return max(self._at - now, 0.0)

    def expired(self, now: float) -> bool:
        """Whether the node gives up now: the deadline passed and it was not a spare.

        Reads the state when the deadline has passed (see the module's
        docstring); raises what the holder raises when it cannot.
        """
        if now < self._at:
            return False
        was_spare = self._spare
        state, _ = self._holder.load()
        self._spare = self._node in state.redundancy_list
        if self._spare or was_spare:
            self._at = now + self._join
            return False
        return True
