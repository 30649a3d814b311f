"""Watching and closing a run of PyTorch's own c10d rendezvous (a torchrun job) on a store.

For operators (``tp-rdzv status --backend c10d``, ``tp-rdzv close --backend
c10d``): reading writes nothing; closing compare-and-sets the state as
PyTorch's nodes do, so a node writing at the same moment loses cleanly and
re-reads the closed state.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from tp_rdzv_api import RendezvousConnectionError, RendezvousTimeoutError
from tp_rdzv_dynamic.documents.layout import torch_state_key
from tp_rdzv_dynamic.model.node_desc import _NodeDesc
from tp_rdzv_dynamic.model.state import RendezvousState
from tp_rdzv_dynamic.status import RendezvousStatus, build_status
from tp_store import Store, StoreError

from .torch_state import (
    TORCH_VACANT,
    TorchNode,
    TorchRendezvousState,
    decode_torch_state,
    encode_torch_state,
)


class TorchC10dRun:
    """The state PyTorch's c10d rendezvous keeps for ``run_id`` in ``store``."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.key = torch_state_key(run_id)

    def _where(self) -> str:
        return f"key {self.key!r} (PyTorch's c10d rendezvous of run {self.run_id!r})"

    def read(self) -> tuple[TorchRendezvousState, bytes] | None:
        """The state and the stored value (its token); ``None`` when there is no key.

        PyTorch's placeholder (an agent started, nothing decided yet) reads as a
        fresh state. Read-only: it never creates the key.
        """
        try:
            if not self.store.check([self.key]):
                return None
            value = self.store.get(self.key)
        except StoreError as exc:
            raise RendezvousConnectionError(f"cannot read {self._where()}: {exc}") from exc
        if value == TORCH_VACANT:
            return TorchRendezvousState(), value
        return decode_torch_state(value, self._where()), value

    def status(self, state: TorchRendezvousState) -> RendezvousStatus:
        """``state`` as an observer sees it; ages from PyTorch's heartbeat times (UTC).

        PyTorch nodes stamp heartbeats with their own wall clocks, so the ages
        include any clock skew between them and this machine.
        """
        now = datetime.now(timezone.utc)
        ages = {
            str(node): (now - beat).total_seconds() for node, beat in state.last_heartbeats.items()
        }
        ours = RendezvousState(
            round=state.round,
            complete=state.complete,
            closed=state.closed,
            participants={_ours(node): rank for node, rank in sorted(state.participants.items())},
            wait_list=dict.fromkeys(_ours(node) for node in sorted(state.wait_list)),
            redundancy_list=dict.fromkeys(_ours(node) for node in sorted(state.redundancy_list)),
        )
        return build_status(self.run_id, "c10d", ours, None, ages)

    def close(self, timeout: float) -> TorchRendezvousState:
        """Mark the run closed, as PyTorch's ``set_closed`` does; the state now stored.

        Raises:
            RendezvousTimeoutError: other writers kept winning for ``timeout`` seconds.
            RendezvousConnectionError: the store failed, or the run has no state key.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = self.read()
            if found is None:
                raise RendezvousConnectionError(f"there is no {self._where()}")
            state, token = found
            if state.closed:
                return state
            state.closed = True
            desired = encode_torch_state(state)
            try:
                if self.store.compare_set(self.key, token, desired) == desired:
                    return state
            except StoreError as exc:
                raise RendezvousConnectionError(f"cannot write {self._where()}: {exc}") from exc
            # A node wrote meanwhile (a heartbeat): close what it wrote.
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(
                    f"timed out closing {self._where()}: other writers kept winning "
                    f"for {timeout:g} s"
                )


def _ours(node: TorchNode) -> _NodeDesc:
    return _NodeDesc(node.addr, node.pid, node.local_id)
