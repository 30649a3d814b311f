"""torchrun's plugin ``tp-etcd``: backend ``etcd`` under the name torchrun asked for."""

from __future__ import annotations

import uuid
from datetime import timedelta
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

from tp_rdzv_etcd.local import LocalEtcd
from tp_rdzv_etcd.store import EtcdStore


def torchrun_params(endpoint: str, **config: object) -> SimpleNamespace:
    """PyTorch's RendezvousParameters as torchrun fills them: attributes, strings, its timeout."""
    return SimpleNamespace(
        backend="tp-etcd",
        endpoint=endpoint,
        run_id="job",
        min_nodes=1,
        max_nodes=1,
        local_addr="127.0.0.1",
        config={
            "timeout": 900,
            "etcd_prefix": f"/torchrun/{uuid.uuid4().hex}",
            "last_call_timeout": "0.1",
            **config,
        },
    )


def test_the_entry_point_runs_a_round_on_etcd(etcd1: LocalEtcd) -> None:
    (entry,) = entry_points(group="torchrun.handlers", name="tp-etcd")
    creator = entry.load()()
    assert creator is entry.load()()
    handler = creator(torchrun_params(etcd1.endpoints, keep_alive_interval="1"))
    assert handler.get_backend() == "tp-etcd"
    assert isinstance(handler._store, EtcdStore)
    assert handler.settings.keep_alive_interval == timedelta(seconds=1)
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert handler.shutdown()


def test_is_host_true_is_refused_as_by_backend_etcd() -> None:
    (entry,) = entry_points(group="torchrun.handlers", name="tp-etcd")
    with pytest.raises(ValueError, match="'is_host' cannot be true"):
        entry.load()()(torchrun_params("127.0.0.1:1", is_host="1"))
