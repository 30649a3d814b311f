"""``RendezvousHandler``: the interface every rendezvous backend implements."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .info import RendezvousInfo


class RendezvousHandler(abc.ABC):
    """Algorithmic interface of one rendezvous backend."""

    @abc.abstractmethod
    def get_backend(self) -> str:
        """Backend name (e.g. static or core)."""

    @abc.abstractmethod
    def get_run_id(self) -> str:
        """Run identifier of this rendezvous."""

    @abc.abstractmethod
    def is_closed(self) -> bool:
        """Whether the rendezvous has been marked closed."""

    @abc.abstractmethod
    def next_rendezvous(self) -> RendezvousInfo:
        """Join or re-join the rendezvous; blocks until this round completes."""

    @abc.abstractmethod
    def num_nodes_waiting(self) -> int:
        """Number of nodes queued for the next round (pending scale-up)."""

    def pre_shutdown(self) -> None:  # noqa: B027 - an optional hook, deliberately empty
        """Optional hook invoked before :meth:`shutdown` during agent teardown."""

    @abc.abstractmethod
    def set_closed(self) -> None:
        """Mark the rendezvous closed; new joiners are rejected."""

    @abc.abstractmethod
    def shutdown(self) -> bool:
        """Release rendezvous resources; returns True when the backend shut down."""

    @property
    def use_agent_store(self) -> bool:
        """Whether workers can reuse the agent-held store as their bootstrap store."""
        return False
