"""The store keys through which nodes and the steward talk (see docs/design).

Every store failure leaves this module as a
:class:`~tp_rdzv_api.RendezvousConnectionError` naming the run, so callers
deal with one exception type.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from tp_rdzv_api import RendezvousConnectionError
from tp_store import Store, StoreError, StoreTimeoutError

from .decisions import Event, Join, Leave
from .documents import MAX_MESSAGE_BYTES, load_document
from .node import MAX_ADDR_LENGTH, _NodeDesc, node_from_fields
from .state import RoundOutcome, decode_outcome

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: The most messages the steward takes from the mailbox before deciding.
MAX_BATCH = 4096
#: Receipts name keys below this part of the run's keys: a message cannot make
#: the steward write any other (``closed``, ``steward``, ``state``...).
RECEIPT_PREFIX = "rcpt/"
#: The longest receipt: the prefix, a node's key (address, pid, local id) and a counter.
MAX_RECEIPT_LENGTH = len(RECEIPT_PREFIX) + MAX_ADDR_LENGTH + 64


@dataclass(frozen=True)
class Lease:
    """The steward lease as read from the store.

    Who holds it, at which epoch, its heartbeat, and the round a joining node
    should wait for: one read tells a joiner both whom to trust and where to
    wait.
    """

    raw: bytes
    epoch: int
    holder: str  # a node key, or "" when vacant
    round: int = 0

    @classmethod
    def parse(cls, raw: bytes) -> Lease:
        """The lease in ``raw``; anything unreadable counts as vacant at epoch 0, round 0.

        So does a lease longer than :data:`~.documents.MAX_MESSAGE_BYTES`
        (no steward writes one): what a store writer put there costs no more
        to read than a real lease.
        """
        if len(raw) > MAX_MESSAGE_BYTES:
            return cls(raw, 0, "")
        parts = raw.split(b" ")
        if len(parts) != 4:
            return cls(raw, 0, "")
        try:
            epoch, round_ = int(parts[0]), int(parts[3])
            holder = "" if parts[1] == b"-" else parts[1].decode()
        except (ValueError, UnicodeDecodeError):
            return cls(raw, 0, "")
        return cls(raw, max(epoch, 0), holder, max(round_, 0))

    @staticmethod
    def encode(epoch: int, holder: str, beat: int, round_: int) -> bytes:
        """The lease of ``holder`` (``""``: vacant) at heartbeat ``beat``, hinting ``round_``."""
        return f"{epoch} {holder or '-'} {beat} {round_}".encode()


def encode_message(event: Event, receipt: str | None = None) -> bytes:
    """A mailbox message carrying ``event``."""
    node = event.node
    document: dict[str, object] = {
        "op": "join" if isinstance(event, Join) else "leave",
        "node": [node.addr, node.pid, node.local_id],
    }
    if isinstance(event, Join):
        document["round"] = event.round
        if event.hint is not None:
            document["hint"] = event.hint
    if receipt is not None:
        document["receipt"] = receipt
    return json.dumps(document, separators=(",", ":")).encode()


def decode_message(raw: bytes) -> tuple[Event | None, str | None]:
    """The event (``None`` for a wake-up) and receipt in a mailbox message.

    Raises ``ValueError`` if the message is malformed, longer than
    :data:`~.documents.MAX_MESSAGE_BYTES` or nested too deeply.
    """
    document = load_document(raw, MAX_MESSAGE_BYTES)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    if document.get("op") == "wake":
        return None, None
    fields = document.get("node")
    if not isinstance(fields, list) or len(fields) != 3:
        raise ValueError(f"bad node {fields!r:.200}: expected [address, pid, local id]")
    try:
        node = node_from_fields(*fields)
    except ValueError as exc:
        raise ValueError(f"bad node: {exc}") from exc
    receipt = document.get("receipt")
    if receipt is not None and not (
        isinstance(receipt, str)
        and receipt.startswith(RECEIPT_PREFIX)
        and len(receipt) <= MAX_RECEIPT_LENGTH
    ):
        raise ValueError(
            f"bad receipt {receipt!r:.200}: expected {RECEIPT_PREFIX!r} and at most "
            f"{MAX_RECEIPT_LENGTH} characters"
        )
    op = document.get("op")
    if op == "leave":
        return Leave(node), receipt
    if op != "join":
        raise ValueError(f"unknown op {op!r:.200}")
    hint = document.get("hint")
    if hint is not None and (type(hint) is not int or hint < 0):
        raise ValueError(f"bad hint {hint!r:.200}")
    round_ = document.get("round")
    if type(round_) is not int or round_ < 0:
        raise ValueError(f"bad round {round_!r:.200}")
    return Join(node, hint, round_), receipt


class RendezvousBoard:
    """The side channels of one run on one store connection (not thread-safe)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self._prefix = f"tp_rdzv/{run_id}/"
        self._mailbox = self._key("mailbox")
        self._lease = self._key("steward")
        self._closed = self._key("closed")
        self._waiting = self._key("waiting")
        self._pending = self._key("pending")
        self._liveness = self._key("liveness")

    def _key(self, name: str) -> str:
        return self._prefix + name

    def outcome_key(self, round_: int) -> str:
        """Where the outcome of ``round_`` is published."""
        return self._key(f"result/{round_}")

    def heartbeat_key(self, node: _NodeDesc) -> str:
        """The heartbeat counter of ``node``."""
        return self._key(f"hb/{node.key}")

    def stale_key(self, round_: int) -> str:
        """Set once the completed ``round_`` no longer describes the job."""
        return self._key(f"stale/{round_}")

    @contextmanager
    def _store_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except StoreError as exc:
            raise RendezvousConnectionError(
                f"rendezvous {self.run_id!r}: the store failed while {what}: {exc}"
            ) from exc

    def _call(self, what: str, operation: Callable[[], _T]) -> _T:
        with self._store_errors(what):
            return operation()

    # -- what every node does -------------------------------------------------
    def beat(self, node: _NodeDesc) -> None:
        """One heartbeat of ``node``."""
        self._call("sending a heartbeat", lambda: self.store.add(self.heartbeat_key(node), 1))

    def post(self, event: Event, receipt: str | None = None) -> None:
        """Put ``event`` in the mailbox for the steward."""
        message = encode_message(event, receipt)
        self._call("posting to the mailbox", lambda: self.store.queue_push(self._mailbox, message))

    def is_closed(self) -> bool:
        """Whether the rendezvous has been closed."""
        return self._call("checking for closure", lambda: self.store.check([self._closed]))

    def waiting(self) -> int:
        """The number of nodes in the wait list."""
        return self._call("reading the wait list", lambda: self.store.add(self._waiting, 0))

    def pending(self) -> int:
        """The number of nodes gathered in the open round."""
        return self._call("reading the open round", lambda: self.store.add(self._pending, 0))

    def await_outcome(self, round_: int, timeout: float) -> RoundOutcome | None:
        """The outcome of ``round_`` once published, or ``None`` after ``timeout`` seconds."""
        key = self.outcome_key(round_)
        with self._store_errors(f"waiting for round {round_}"):
            try:
                raw = self.store.wait_get(key, timeout)
            except StoreTimeoutError:
                return None
        return decode_outcome(raw, key)

    def await_stale(self, round_: int, timeout: float) -> bool:
        """Whether the completed ``round_`` turns stale within ``timeout`` seconds."""
        return self._appears(self.stale_key(round_), timeout, f"watching round {round_}")

    def is_stale(self, round_: int) -> bool:
        """Whether the completed ``round_`` is stale now (no waiting)."""
        key = self.stale_key(round_)
        return self._call(f"watching round {round_}", lambda: self.store.check([key]))

    def mark_stale(self, round_: int) -> None:
        """Tell the nodes of the completed ``round_`` that membership changed."""
        self._call(
            f"marking round {round_} stale", lambda: self.store.set(self.stale_key(round_), "1")
        )

    def observe(self) -> tuple[Lease | None, bytes | None]:
        """The lease and the steward's last liveness report, each ``None`` when absent.

        Read-only, for observers: unlike :meth:`read_lease` it creates nothing.
        """
        with self._store_errors("reading the steward's reports"):
            lease, liveness = (
                self.store.get(key) if self.store.check([key]) else None
                for key in (self._lease, self._liveness)
            )
        return (None if lease is None else Lease.parse(lease)), liveness

    def read_lease(self) -> Lease:
        """The steward lease (created vacant if missing), in one round trip."""
        raw = self._call("reading the lease", lambda: self.store.compare_set(self._lease, "", ""))
        return Lease.parse(raw)

    def swap_lease(self, seen: bytes, desired: bytes) -> bytes:
        """Replace the lease if it still holds ``seen``; what it holds afterwards."""
        return self._call(
            "taking the lease", lambda: self.store.compare_set(self._lease, seen, desired)
        )

    def await_receipt(self, receipt: str, timeout: float) -> bool:
        """Whether the steward confirmed ``receipt`` within ``timeout`` seconds."""
        return self._appears(self._key(receipt), timeout, "waiting for a receipt")

    def _appears(self, key: str, timeout: float, what: str) -> bool:
        """Whether ``key`` exists within ``timeout`` seconds."""
        with self._store_errors(what):
            try:
                self.store.wait([key], timeout)
            except StoreTimeoutError:
                return False
        return True

    def claim_closing(self, node: _NodeDesc) -> bool:
        """Whether ``node`` is the one to record the closing (the first to ask)."""
        key = self._key("closing")
        held = self._call("claiming the closing", lambda: self.store.compare_set(key, "", node.key))
        return held == node.key.encode()

    def await_closed(self, timeout: float) -> bool:
        """Whether the rendezvous is marked closed within ``timeout`` seconds."""
        return self._appears(self._closed, timeout, "waiting for the closing")

    def close(self) -> None:
        """Mark the rendezvous closed (the key only; the state is the backend's)."""
        self._call("closing", lambda: self.store.set(self._closed, "1"))

    def publish(self, round_: int, outcome: bytes) -> bytes:
        """Publish the outcome of ``round_`` unless one is there; return what is there."""
        key = self.outcome_key(round_)
        return self._call(
            f"publishing round {round_}", lambda: self.store.compare_set(key, "", outcome)
        )

    # -- what only the steward does -------------------------------------------
    def await_mail(self, timeout: float) -> bool:
        """Whether the mailbox holds a message within ``timeout`` seconds."""
        return self._appears(self._mailbox, timeout, "waiting for the mailbox")

    def take_mail(self) -> list[tuple[Event | None, str | None]]:
        """Up to :data:`MAX_BATCH` mailbox messages; malformed ones are logged and dropped.

        Two round trips however many there are: the queue's length, then that
        many pops pipelined (one round trip per message made a storm of joins
        cost the steward seconds).
        """
        messages: list[tuple[Event | None, str | None]] = []
        with self._store_errors("reading the mailbox"):
            queued = self.store.queue_len(self._mailbox)
            raws = self.store.queue_pop_many(self._mailbox, min(queued, MAX_BATCH))
        for raw in raws:
            try:
                messages.append(decode_message(raw))
            except (ValueError, UnicodeDecodeError) as exc:
                log.warning(
                    "rendezvous %r: dropped a malformed mailbox message %r: %s",
                    self.run_id,
                    raw[:200],
                    exc,
                )
        return messages

    def sample_heartbeats(
        self, nodes: Sequence[_NodeDesc], unseen: Sequence[_NodeDesc] = ()
    ) -> list[bytes]:
        """The heartbeat counters of ``nodes``, without waiting for any.

        Honest nodes beat before they post, but a forged join names a node
        whose counter never appears, and ``multi_get`` waits for every key:
        so the counters of ``unseen`` nodes (those not sampled before) are
        checked first, in one round trip, and created as ``0`` when missing.
        A created counter that never moves makes its node dead after the
        liveness bound, like any silent node.
        """
        keys = [self.heartbeat_key(node) for node in nodes]
        new = [self.heartbeat_key(node) for node in unseen]
        with self._store_errors("reading heartbeats"):
            if new and not self.store.check(new):
                for key in new:
                    self.store.add(key, 0)
            return self.store.multi_get(keys) if keys else []

    def publish_counters(self, waiting: int, pending: int, liveness: bytes | None = None) -> None:
        """Publish the counters nodes read with ``add(key, 0)``, and a liveness report."""
        keys = [self._waiting, self._pending]
        values: list[str | bytes] = [str(waiting), str(pending)]
        if liveness is not None:
            keys.append(self._liveness)
            values.append(liveness)
        self._call("publishing counters", lambda: self.store.multi_set(keys, values))

    def wake(self) -> None:
        """Wake a steward blocked on the mailbox (it ignores the message)."""
        self._call(
            "waking the steward", lambda: self.store.queue_push(self._mailbox, b'{"op":"wake"}')
        )

    def confirm(self, receipts: Sequence[str]) -> None:
        """Confirm that the messages carrying ``receipts`` are persisted."""
        if receipts:
            keys = [self._key(receipt) for receipt in receipts]
            self._call("confirming receipts", lambda: self.store.multi_set(keys, ["1"] * len(keys)))
