"""``DynamicRendezvousHandler``'s arguments checked, in our form or PyTorch's positional one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from tp_rdzv_dynamic.backends.backend import RendezvousBackend
from tp_rdzv_dynamic.backends.holder import _RendezvousStateHolder
from tp_rdzv_dynamic.model.node_desc import _NodeDesc, _NodeDescGenerator, address_problem
from tp_rdzv_dynamic.quoting import quoted
from tp_rdzv_dynamic.settings import RendezvousSettings
from tp_store import Store


@dataclass(frozen=True)
class HandlerArguments:
    """What a handler is built from, every part checked."""

    node: _NodeDesc
    settings: RendezvousSettings
    backend_name: str
    store: Store
    holder: _RendezvousStateHolder
    node_rank: int


def check_arguments(  # noqa: PLR0917 - the handler's documented signature
    backend: object,
    settings: object,
    local_addr: object,
    node_rank: object,
    run_id: object,
    store: object,
    backend_name: object,
    state_holder: object,
    node: object,
    generator: _NodeDescGenerator,
) -> HandlerArguments:
    """The handler's arguments, in its parameters' order; ``generator`` names a missing node.

    Raises ``TypeError`` or ``ValueError`` naming the first bad one.
    """
    if isinstance(backend, _NodeDesc):
        # PyTorch's positional form: its backend_name, store and state_holder
        # arrive in the slots of local_addr, node_rank and run_id.
        if node is not None:
            raise TypeError("DynamicRendezvousHandler got the node twice")
        node, backend = backend, None
        if isinstance(local_addr, str):
            backend_name, local_addr = local_addr, None
        if isinstance(node_rank, Store):
            store, node_rank = node_rank, 0
        if isinstance(run_id, _RendezvousStateHolder):
            state_holder, run_id = run_id, ""
    checked = _check_settings(settings, run_id)
    if not isinstance(node_rank, int) or isinstance(node_rank, bool) or node_rank < 0:
        raise ValueError(f"node_rank must be an int >= 0, got {node_rank!r}")
    problem = None if local_addr is None else address_problem(local_addr)
    if problem is not None:
        raise ValueError(f"local_addr {quoted(local_addr)} {problem}")
    if not isinstance(backend_name, str) or not backend_name:
        raise ValueError(f"backend_name must be a non-empty str, got {backend_name!r}")
    holder = _check_holder(backend, state_holder, checked.run_id)
    if store is None:
        store = getattr(holder.backend, "store", None)
    if not isinstance(store, Store):
        raise TypeError(
            f"DynamicRendezvousHandler needs a tp_store.Store (store=...), got {store!r}"
        )
    if node is None:
        node = generator.generate(cast(str | None, local_addr))  # checked above
    elif not isinstance(node, _NodeDesc):
        raise TypeError(f"node must be a _NodeDesc, got {node!r}")
    return HandlerArguments(node, checked, backend_name, store, holder, node_rank)


def _check_settings(settings: object, run_id: object) -> RendezvousSettings:
    if settings is None:
        if not isinstance(run_id, str):
            raise TypeError(f"run_id must be a str, got {run_id!r}")
        settings = RendezvousSettings(run_id=run_id)
    if not isinstance(settings, RendezvousSettings):
        raise TypeError(f"settings must be a RendezvousSettings, got {settings!r}")
    if run_id and run_id != settings.run_id:
        if settings.run_id:
            raise ValueError(
                f"run_id {run_id!r} differs from the settings' run_id {settings.run_id!r}"
            )
        raise ValueError("give the run id in the settings (RendezvousSettings(run_id=...))")
    if not settings.run_id:
        raise ValueError("The run id must be a non-empty string.")
    return settings


def _check_holder(backend: object, state_holder: object, run_id: str) -> _RendezvousStateHolder:
    if state_holder is not None:
        if not isinstance(state_holder, _RendezvousStateHolder):
            raise TypeError(f"state_holder must be a _RendezvousStateHolder, got {state_holder!r}")
        if backend is not None and backend is not state_holder.backend:
            raise TypeError("give a backend or a state_holder, not two different ones")
        return state_holder
    if not isinstance(backend, RendezvousBackend):
        raise TypeError(f"DynamicRendezvousHandler needs a RendezvousBackend, got {backend!r}")
    return _RendezvousStateHolder(backend, run_id)
