"""``TpRendezvousBackend``: the state document as raw bytes at ``tp_rdzv/<run_id>/state``."""

from __future__ import annotations

from tp_rdzv_dynamic.documents.layout import state_key

from ._store_backend import StoreKeyBackend


class TpRendezvousBackend(StoreKeyBackend):
    """Keeps the rendezvous document of one run, unencoded, in a ``tp_store.Store``.

    The document lives at ``tp_rdzv/<run_id>/state``, next to the other keys of
    the run. An empty or missing key means that no document is stored, so an
    empty document cannot be stored. The fencing token is the stored value.

    Args:
        store: the store shared by every node of the run.
        run_id: the run's identifier: letters, digits, ``.``, ``_`` and ``-``.

    Raises:
        TypeError: ``store`` is not a ``tp_store.Store`` or ``run_id`` not a str.
        ValueError: ``run_id`` is empty or has other characters.
        RendezvousConnectionError: the store could not be reached.
    """

    @property
    def name(self) -> str:
        """``core``: the registry name of the handlers on this backend."""
        return "core"

    @staticmethod
    def _key_for(run_id: str) -> str:
        return state_key(run_id)
