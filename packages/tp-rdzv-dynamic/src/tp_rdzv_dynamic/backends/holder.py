"""``_RendezvousStateHolder``: the state document read and written through a backend."""

from __future__ import annotations

from tp_rdzv_dynamic.documents.codecs import decode_state, encode_state
from tp_rdzv_dynamic.model.state import RendezvousState

from ._store_backend import StoreKeyBackend
from .backend import RendezvousBackend, Token


class _RendezvousStateHolder:
    """Reads and compare-and-sets the :class:`RendezvousState` of one run.

    Args:
        backend: where the document lives.
        run_id: the run, for error messages.
    """

    def __init__(self, backend: RendezvousBackend, run_id: str) -> None:
        self.backend = backend
        self.run_id = run_id
        # Error messages name the key when the backend tells it.
        key = getattr(backend, "key", None)
        self.where = (
            f"key {key!r} ({backend.name} backend)"
            if isinstance(key, str)
            else f"the {backend.name} backend of run {run_id!r}"
        )

    def clone(self) -> _RendezvousStateHolder:
        """A holder over the backend's own new connection (for another thread)."""
        return _RendezvousStateHolder(self.backend.clone(), self.run_id)

    def close(self) -> None:
        """Release the backend's connection if it owns one."""
        self.backend.close()

    def load(self) -> tuple[RendezvousState, Token | None]:
        """The stored state and its token; a fresh state and ``None`` when nothing is stored."""
        stored = self.backend.get_state()
        if stored is None:
            return RendezvousState(), None
        raw, token = stored
        return decode_state(raw, self.where), token

    def observe(self) -> RendezvousState | None:
        """The stored state, or ``None`` when nothing is stored; for observers.

        Writes nothing on our store backends (``load`` may create the empty
        key); another backend's ``get_state`` is used as it is.
        """
        backend = self.backend
        stored = (
            backend.read_state() if isinstance(backend, StoreKeyBackend) else backend.get_state()
        )
        return None if stored is None else decode_state(stored[0], self.where)

    def save(
        self, state: RendezvousState, token: Token | None
    ) -> tuple[RendezvousState, Token | None, bool]:
        """Write ``state`` if ``token`` is current: the state now stored, its token, and success.

        On failure the returned state is the one that won (or what is stored).
        """
        raw = encode_state(state)
        result = self.backend.set_state(raw, token)
        if result is None:
            # The backend cannot tell what is stored (PyTorch's type allows it, and
            # PyTorch's own test backend answers None even for a write that landed):
            # read it back; the write won if our state is what is there now.
            stored, new_token = self.load()
            return stored, new_token, stored == state
        stored_raw, new_token, won = result
        if won:
            return state, new_token, True
        return decode_state(stored_raw, self.where), new_token, False
