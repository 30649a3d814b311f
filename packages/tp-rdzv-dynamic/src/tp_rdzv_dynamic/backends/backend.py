"""``RendezvousBackend``: where the rendezvous state document lives.

A backend stores one opaque document per run and replaces it with
compare-and-set. Every successful read or write hands back a *fencing token*
naming the version it saw; a write succeeds only when the token still names the
stored version, so a stale writer (a deposed steward, a slow node) can never
overwrite a newer decision.
"""

from __future__ import annotations

import abc
from typing import Any

#: An opaque fencing token: only the backend that issued it may interpret it.
Token = Any


class RendezvousBackend(abc.ABC):
    """Rendezvous state backend: one document per run, replaced by compare-and-set."""

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The registry name of the handlers built on this backend (e.g. ``core``)."""

    @abc.abstractmethod
    def get_state(self) -> tuple[bytes, Token] | None:
        """The stored document and its fencing token; ``None`` when nothing is stored yet.

        Raises:
            RendezvousConnectionError: the store could not be reached.
            RendezvousStateError: the stored value is not one this backend wrote.
        """

    @abc.abstractmethod
    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """Replace the document if ``token`` still names the stored version.

        ``token`` is ``None`` to create the first document. Returns the document
        now stored, its token, and whether it is ``state`` (the write won); or
        ``None`` when the backend cannot tell what is stored.

        Raises:
            RendezvousConnectionError: the store could not be reached.
            RendezvousStateError: the stored value is not one this backend wrote.
        """

    def clone(self) -> RendezvousBackend:
        """A backend on the same state over its own store connection.

        The steward calls this to get a connection no other thread blocks on.
        The default shares this backend, which is right for backends whose
        calls never wait behind another thread's blocking request.
        """
        return self

    def close(self) -> None:  # noqa: B027 - most backends own nothing to release
        """Release the store connection this backend owns, if any (clones own theirs)."""
