"""torchrun's plugin: ``torchrun --rdzv-backend=tp-etcd`` runs our dynamic rendezvous on etcd.

The entry point ``tp-etcd`` of ``torchrun.handlers``; how torchrun loads it is
told in :mod:`tp_rdzv_dynamic.torch_compat.torchrun`. Nothing here imports torch.
"""

from __future__ import annotations

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_dynamic import DynamicRendezvousHandler
from tp_rdzv_dynamic.factory import build_handler
from tp_rdzv_dynamic.torch_compat.torchrun import TorchrunCreator

from .factory import CONFIG_KEYS, create_store


def create_tp_etcd_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """Backend ``etcd`` (every config key of it) under the name torchrun asked for."""
    return build_handler(params, params.backend, create_store, config_keys=CONFIG_KEYS)


def tp_etcd() -> TorchrunCreator:
    """Entry point ``tp-etcd`` of ``torchrun.handlers``: always the same creator."""
    return create_tp_etcd_handler
