"""The store keys of a run, built in one place (the table in docs/design/dynamic-rendezvous.md).

Every key of run ``R`` lies below ``tp_rdzv/R/``, except the state document
of the ``p10d`` backend, which lives where PyTorch's c10d backend keeps it
(:func:`torch_state_key`). Other versions of this package and the CLI's
``status`` and ``close`` read these keys: renaming one is a change of the wire
format.
"""

from __future__ import annotations

from tp_rdzv_dynamic.model.node_desc import MAX_ADDR_LENGTH

#: Receipts name keys below this part of the run's keys: a message cannot make
#: the steward write any other (``closed``, ``steward``, ``state``...).
RECEIPT_PREFIX = "rcpt/"
#: The longest receipt: the prefix, a node's key (address, pid, local id) and a counter.
MAX_RECEIPT_LENGTH = len(RECEIPT_PREFIX) + MAX_ADDR_LENGTH + 64


def run_prefix(run_id: str) -> str:
    """The prefix of every key of run ``run_id``."""
    return f"tp_rdzv/{run_id}/"


def state_key(run_id: str) -> str:
    """Where ``TpRendezvousBackend`` keeps the state document of run ``run_id``."""
    return run_prefix(run_id) + "state"


def torch_state_key(run_id: str) -> str:
    """The store key of run ``run_id``'s state in PyTorch's c10d layout (``p10d``, ``c10d``)."""
    return f"torch.rendezvous.{run_id}"


class RunLayout:
    """The keys through which the nodes and the steward of one run talk."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.prefix = run_prefix(run_id)
        #: The queue of messages (joins, leaves) for the steward.
        self.mailbox = self.prefix + "mailbox"
        #: The steward lease.
        self.lease = self.prefix + "steward"
        #: Exists once the rendezvous is closed.
        self.closed = self.prefix + "closed"
        #: The node recording the closing (the first to claim it).
        self.closing = self.prefix + "closing"
        #: The number of nodes in the wait list.
        self.waiting = self.prefix + "waiting"
        #: The number of nodes gathered in the open round.
        self.pending = self.prefix + "pending"
        #: The steward's report of heartbeat ages.
        self.liveness = self.prefix + "liveness"
        #: What every round's outcome key starts with: one small key per round, written once.
        self.outcomes = self.prefix + "result/"

    def outcome(self, round_: int) -> str:
        """Where the outcome of ``round_`` is published (small: what every node waits for)."""
        return f"{self.outcomes}{round_}"

    def answer(self, round_: int, node_key: str) -> str:
        """The answer of ``round_`` to the node whose key is ``node_key``: its seat.

        Written (in batches) before the outcome, for the participants only.
        """
        return f"{self.prefix}answer/{round_}/{node_key}"

    def roster(self, round_: int) -> str:
        """The full lists of ``round_`` (participants in rank order, wait and redundancy
        lists), written before the outcome; read by whoever asks, not by every node."""
        return f"{self.prefix}roster/{round_}"

    def heartbeat(self, node_key: str) -> str:
        """The heartbeat counter of the node whose key is ``node_key`` (stores without sessions)."""
        return f"{self.prefix}hb/{node_key}"

    def presence(self, node_key: str) -> str:
        """The ephemeral key of the node whose key is ``node_key``: its session's token."""
        return f"{self.prefix}present/{node_key}"

    def stale(self, round_: int) -> str:
        """Set once the completed ``round_`` no longer describes the job."""
        return f"{self.prefix}stale/{round_}"

    def vacated(self, epoch: int) -> str:
        """Pushed by the will of the steward of ``epoch`` when the session it holds the
        lease through ends: nodes waiting for a round wake, and one takes the lease over."""
        return f"{self.prefix}vacated/{epoch}"

    def receipt(self, receipt: str) -> str:
        """The key confirming ``receipt`` (which starts with :data:`RECEIPT_PREFIX`)."""
        return self.prefix + receipt

    def new_receipt(self, node_key: str, serial: int) -> str:
        """The receipt a node names in its ``serial``-th message that asks for one."""
        return f"{RECEIPT_PREFIX}{node_key}/{serial}"

    def bootstrap(self, round_: int) -> str:
        """Where rank 0 of ``round_`` publishes its workers' bootstrap store (address and port)."""
        return f"{self.prefix}bootstrap/{round_}"

    def round_store(self, round_: int) -> str:
        """The prefix of the store the nodes of ``round_`` get (``RendezvousInfo.store``)."""
        return f"{self.prefix}r{round_}"
