"""torchrun's plugin: ``torchrun --rdzv-backend=tp`` runs our dynamic rendezvous.

torchrun reads the entry-point group ``torchrun.handlers`` once, when it
imports its rendezvous package: it calls each entry point's object with no
argument and registers what that returns as the creator of the backend named
like the entry point. It calls the creator with its own
``RendezvousParameters`` and checks that the handler's ``get_backend()`` is
the name the user typed.

Nothing here imports torch: its parameters are read by attribute
(:meth:`tp_rdzv_api.RendezvousParameters.convert`), and its agent uses the
handler, the ``RendezvousInfo`` and our stores through their methods alone.
"""

from __future__ import annotations

from collections.abc import Callable

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_dynamic.factory import build_handler, create_store
from tp_rdzv_dynamic.handler import DynamicRendezvousHandler

#: What torchrun registers: its RendezvousParameters in, a handler out.
TorchrunCreator = Callable[[RendezvousParameters], DynamicRendezvousHandler]


def create_tp_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``core`` (every config key of it) under the name torchrun asked for.

    An agent has one handler: its bootstrap store's process starts now and
    imports while the rendezvous runs, so the first round this node hosts (a
    restart after rank 0 died, say) does not wait for it.
    """
    handler = build_handler(params, params.backend, create_store)
    handler._bootstrap.prestart()
    return handler


def tp() -> TorchrunCreator:
    """Entry point ``tp`` of ``torchrun.handlers``: the creator torchrun registers.

    Always the same function, so a distribution found twice on the path
    registers one creator, not two that torch's registry would refuse.
    """
    return create_tp_handler
