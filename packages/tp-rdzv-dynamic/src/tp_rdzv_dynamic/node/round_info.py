"""What ``next_rendezvous()`` returns: the node lists read from the round's roster when asked.

A node learns its rank and the world size from its own answer; the lists of
every participant (``participants``, ``wait_list``) are O(N) bytes, which
every node of a large job reading at once made O(N^2). They are read from the
round's roster the first time one is asked for (decoded once per process), so
a node that never asks (torchrun's agent does not) never reads them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tp_rdzv_api import RendezvousInfo, RendezvousStateError, RendezvousStoreInfo
from tp_rdzv_dynamic.documents.answers import Roster, Seat
from tp_store import Store


class RoundInfo(RendezvousInfo):
    """A :class:`~tp_rdzv_api.RendezvousInfo` whose node lists are read on first use.

    Reading them may raise :class:`~tp_rdzv_api.RendezvousConnectionError`
    (the store failed) or :class:`~tp_rdzv_api.RendezvousStateError` (the
    roster is corrupt).
    """

    __slots__ = ("_lists_lock", "_lists_read", "_read_roster", "_round")

    def __init__(
        self,
        store: Store,
        seat: Seat,
        bootstrap_store_info: RendezvousStoreInfo | None,
        read_roster: Callable[[int], Roster],
    ) -> None:
        super().__init__(store, seat.rank, seat.world_size, bootstrap_store_info)
        self._read_roster = read_roster
        self._round = seat.round
        self._lists_read = False
        self._lists_lock = threading.Lock()

    @property
    def participants(self) -> list[Any]:
        """Nodes participating in this round (a copy, in rank order)."""
        self._read_lists()
        return list(self._participants)

    @property
    def wait_list(self) -> list[Any]:
        """Nodes waiting for a future round (a copy)."""
        self._read_lists()
        return list(self._wait_list)

    def __repr__(self) -> str:
        self._read_lists()
        return super().__repr__()

    def _read_lists(self) -> None:
        with self._lists_lock:
            if self._lists_read:
                return
            roster = self._read_roster(self._round)
            if len(roster.participants) != self.world_size or roster.round != self._round:
                raise RendezvousStateError(
                    f"the roster of round {self._round} lists {len(roster.participants)} "
                    f"participants of round {roster.round}; this node was told "
                    f"{self.world_size} in round {self._round}"
                )
            self._participants = list(roster.participants)
            self._wait_list = list(roster.wait_list)
            self._lists_read = True
