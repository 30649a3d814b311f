"""Who owns which key, and what a store session's end deletes and pushes; no I/O.

The rules of :mod:`tp_store.session` as data, shared by every store that
offers sessions (``HashStore`` in-process, the TCPStore server): each session
is a :class:`Presence`, and one :class:`PresenceBook` per store maps owned
keys to their owner. The store applies what the book decides to its data,
under its own lock or event loop.
"""

from __future__ import annotations

from .errors import StoreLimitError
from .semantics import key_text

#: Bytes a will or an owned key costs besides its own bytes (the
#: containers' entries), counted in a server's memory budget.
ENTRY_OVERHEAD_BYTES = 64


class Presence:
    """One store session's holdings: the keys it owns and its wills, in order."""

    __slots__ = ("ended", "held_bytes", "owned", "wills")

    def __init__(self) -> None:
        # A dict as an ordered set: keys are deleted in the order first owned.
        self.owned: dict[bytes, None] = {}
        self.wills: list[tuple[bytes, bytes]] = []
        #: What its owned keys' names and its wills take, in bytes (approximately).
        self.held_bytes = 0
        self.ended = False


class PresenceBook:
    """The owners of a store's ephemeral keys, and the bounds on each session.

    ``max_keys`` and ``max_wills`` bound what one session owns and holds: past
    them :meth:`may_own` and :meth:`add_will` raise
    :class:`~tp_store.errors.StoreLimitError` and nothing changes.
    """

    def __init__(self, max_keys: int, max_wills: int) -> None:
        self.owners: dict[bytes, Presence] = {}
        self._max_keys = max_keys
        self._max_wills = max_wills

    def may_own(self, presence: Presence, key: bytes) -> None:
        """Raise ``StoreLimitError`` if ``presence`` may not own one more key (call
        it before writing, so a refused write changes nothing)."""
        if len(presence.owned) >= self._max_keys and key not in presence.owned:
            raise StoreLimitError(
                f"a store session may own at most {self._max_keys} keys; writing "
                f"{key_text(key)!r:.80} through it would own one more"
            )

    def own(self, presence: Presence, key: bytes) -> None:
        """``key`` was just written through ``presence``: it owns it now (moved from
        its previous owner, if any)."""
        previous = self.owners.get(key)
        if previous is presence:
            return
        if previous is not None:
            self._disown(previous, key)
        self.owners[key] = presence
        presence.owned[key] = None
        presence.held_bytes += len(key) + ENTRY_OVERHEAD_BYTES

    def release(self, key: bytes) -> None:
        """``key`` was written without a session, or deleted: it is nobody's now."""
        owner = self.owners.pop(key, None)
        if owner is not None:
            self._disown(owner, key)

    def add_will(self, presence: Presence, queue: bytes, value: bytes) -> None:
        """Record that ``value`` is pushed onto ``queue`` when ``presence`` ends."""
        if len(presence.wills) >= self._max_wills:
            raise StoreLimitError(f"a store session may hold at most {self._max_wills} wills")
        presence.wills.append((queue, value))
        presence.held_bytes += len(queue) + len(value) + ENTRY_OVERHEAD_BYTES

    def end(self, presence: Presence) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
        """End ``presence``: the keys the store must delete, then the wills it must
        push (in that order). Empty for a presence already ended."""
        if presence.ended:
            return [], []
        presence.ended = True
        keys = list(presence.owned)
        owners = self.owners
        for key in keys:
            del owners[key]
        wills = presence.wills
        presence.owned = {}
        presence.wills = []
        presence.held_bytes = 0
        return keys, wills

    def _disown(self, owner: Presence, key: bytes) -> None:
        del owner.owned[key]
        owner.held_bytes -= len(key) + ENTRY_OVERHEAD_BYTES
