"""``P10dRendezvousBackend``: the state document in PyTorch's c10d layout."""

from __future__ import annotations

import base64

from tp_rdzv_dynamic.documents.layout import torch_state_key

from ._store_backend import StoreKeyBackend


class P10dRendezvousBackend(StoreKeyBackend):
    """Keeps the rendezvous document of one run where PyTorch's c10d backend keeps its state.

    The key is ``torch.rendezvous.<run_id>`` and the value the base64 of the
    document; the first read creates the key holding PyTorch's placeholder, which means
    that no document is stored (so the document it encodes cannot be stored).
    Values are only ever base64-decoded, never unpickled: a PyTorch node's
    pickled state reads back as opaque bytes. The fencing token is the stored
    value.

    Args:
        store: the store shared by every node of the run.
        run_id: the run's identifier: letters, digits, ``.``, ``_`` and ``-``.

    Raises:
        TypeError: ``store`` is not a ``tp_store.Store`` or ``run_id`` not a str.
        ValueError: ``run_id`` is empty or has other characters.
        RendezvousConnectionError: the store could not be reached.
    """

    # PyTorch's placeholder, so that PyTorch nodes sharing the store read it as
    # "no state" too (it is the base64 of b"canimadam").
    _VACANT = b"Y2FuaW1hZGFt"

    @property
    def name(self) -> str:
        """``p10d``: the registry name of the handlers on this backend."""
        return "p10d"

    @staticmethod
    def _key_for(run_id: str) -> str:
        return torch_state_key(run_id)

    def _encode(self, state: bytes) -> bytes:
        return base64.b64encode(state)

    def _decode(self, value: bytes) -> bytes:
        # Strict: the lenient default would silently drop non-base64 bytes.
        return base64.b64decode(value, validate=True)
