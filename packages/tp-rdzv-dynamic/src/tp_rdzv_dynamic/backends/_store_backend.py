"""What the store backends share: one document in one store key, replaced by ``compare_set``.

The fencing token is the exact value stored in the key: ``compare_set`` with it
as the expected value replaces the document only if nobody wrote since.
"""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import Iterator
from typing import ClassVar

from tp_rdzv_api import RendezvousConnectionError, RendezvousStateError
from tp_store import Store, StoreError

from .backend import RendezvousBackend, Token

_RUN_ID = re.compile(r"[A-Za-z0-9._-]+")


def check_run_id(run_id: object, owner: str) -> str:
    """``run_id`` if it can name store keys; ``TypeError``/``ValueError`` naming it otherwise."""
    if not isinstance(run_id, str):
        raise TypeError(f"{owner} run_id must be a str, got {type(run_id).__name__}")
    if _RUN_ID.fullmatch(run_id) is None:
        raise ValueError(
            f"{owner} run_id must be a non-empty string of letters, digits, '.', '_' "
            f"and '-' (it becomes part of store keys), got {run_id!r:.200}"
        )
    return run_id


def _check_store(store: object, owner: str) -> Store:
    if not isinstance(store, Store):
        raise TypeError(f"{owner} store must be a tp_store.Store, got {type(store).__name__}")
    return store


def _check_state(state: object, owner: str) -> bytes:
    if not isinstance(state, bytes):
        raise TypeError(f"{owner} state must be bytes, got {type(state).__name__}")
    return state


class StoreKeyBackend(RendezvousBackend):
    """A backend that keeps the document of one run in one key of a ``tp_store.Store``.

    Subclasses choose the key, how a document is encoded in it, and which
    value (besides a missing or empty key) means that no document is stored.
    """

    #: The value the key is created with; it, ``b""`` and a missing key mean "no document".
    _VACANT: ClassVar[bytes] = b""

    def __init__(self, store: Store, run_id: str) -> None:
        owner = type(self).__name__
        self._store = _check_store(store, owner)
        self._run_id = check_run_id(run_id, owner)
        self._key = self._key_for(self._run_id)
        # The store given to the constructor is the caller's; a clone's is its own.
        self._owns_store = False
        # Reach the store now, so that a bad endpoint fails here, but write
        # nothing: observers build backends too. The first get_state creates
        # the key (PyTorch's backend creates it at once).
        with self._store_errors():
            self._store.check([self._key])

    @property
    def key(self) -> str:
        """The store key holding the document."""
        return self._key

    @property
    def store(self) -> Store:
        """The store holding the document (a handler without a store of its own uses it)."""
        return self._store

    def clone(self) -> StoreKeyBackend:
        """A backend on the same document over a new handle (``store.clone()``) it closes.

        Raises:
            RendezvousConnectionError: the new handle could not reach the store.
        """
        with self._store_errors():
            store = self._store.clone()
        try:
            twin = type(self)(store, self._run_id)
        except BaseException:
            store.close()
            raise
        twin._owns_store = True
        return twin

    def close(self) -> None:
        """Close the store handle if this backend opened it (a clone); else do nothing."""
        if self._owns_store:
            self._store.close()

    @staticmethod
    @abc.abstractmethod
    def _key_for(run_id: str) -> str:
        """The store key holding the document of ``run_id``."""

    def _encode(self, state: bytes) -> bytes:
        """The value stored for the document ``state``."""
        return state

    def _decode(self, value: bytes) -> bytes:
        """The document a stored value holds; ``ValueError`` if this backend did not write it."""
        return value

    def get_state(self) -> tuple[bytes, Token] | None:
        """The stored document and its fencing token; ``None`` when nothing is stored yet.

        Never blocks on a missing key (``Store.get`` would wait for it).

        Raises:
            RendezvousConnectionError: the store failed or did not answer.
            RendezvousStateError: the stored value is not one this backend wrote.
        """
        # compare_set from empty to vacant is a read that cannot block: it
        # returns the stored value, or creates the vacant one if the key is missing.
        return self._document(self._compare_set(b"", self._VACANT))

    def read_state(self) -> tuple[bytes, Token] | None:
        """As :meth:`get_state`, but writing nothing: a missing key stays missing.

        Two round trips (``get_state`` takes one); for observers.
        """
        with self._store_errors():
            if not self._store.check([self._key]):
                return None
            value = self._store.get(self._key)
        return self._document(value)

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        """Replace the document if ``token`` names the stored version (``None``: if none is).

        Returns the document now stored, its token, and whether it equals
        ``state``; writing the document already stored therefore reports
        success whatever the token. Returns ``None`` when nothing is stored
        after the attempt (the key was deleted behind a stale token). A token
        this backend never issued names no version: the write loses.

        Raises:
            TypeError: ``state`` is not ``bytes``.
            ValueError: ``state`` would read back as "nothing stored".
            RendezvousConnectionError: the store failed or did not answer.
            RendezvousStateError: the stored value is not one this backend wrote.
        """
        desired = self._encode(_check_state(state, type(self).__name__))
        if desired in (b"", self._VACANT):
            raise ValueError(
                f"{type(self).__name__} cannot store the document {state[:40]!r}: "
                f"key {self._key!r} would read back as holding no document"
            )
        # No token this backend issues is empty: b"" can only mean "no token" (as in PyTorch).
        first_write = token is None or token == b""
        if first_write:
            expected = self._VACANT
        elif isinstance(token, bytes):
            expected = token
        else:
            seen = self.get_state()
            return None if seen is None else (*seen, False)
        stored = self._compare_set(expected, desired)
        if stored == expected != desired:
            # Only a missing key makes compare_set echo the expected value.
            if not first_write:
                return None
            stored = self._compare_set(b"", desired)
        document = self._document(stored)
        if document is None:
            return None
        now_stored, new_token = document
        return now_stored, new_token, now_stored == state

    @contextlib.contextmanager
    def _store_errors(self) -> Iterator[None]:
        """Report the store failing or not answering as ``RendezvousConnectionError``."""
        try:
            yield
        except (StoreError, OSError) as exc:
            raise RendezvousConnectionError(
                f"rendezvous {self._run_id!r} could not use its store (key {self._key!r}): {exc}"
            ) from exc

    def _compare_set(self, expected: bytes, desired: bytes) -> object:
        """``compare_set`` on the key; typed ``object``: a third-party store may return anything."""
        with self._store_errors():
            return self._store.compare_set(self._key, expected, desired)

    def _document(self, value: object) -> tuple[bytes, bytes] | None:
        """The document and token a stored value stands for; ``None`` for "no document"."""
        if not isinstance(value, bytes):
            raise RendezvousStateError(
                f"rendezvous {self._run_id!r}: key {self._key!r} holds a "
                f"{type(value).__name__}, not bytes"
            )
        if value in (b"", self._VACANT):
            return None
        try:
            return self._decode(value), value
        except ValueError as exc:
            raise RendezvousStateError(
                f"rendezvous {self._run_id!r}: key {self._key!r} holds {value[:40]!r}, "
                f"which {type(self).__name__} did not write: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"{type(self).__name__}(run_id={self._run_id!r}, key={self._key!r})"
