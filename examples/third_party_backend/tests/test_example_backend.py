"""The example backend, found through its entry point by the registry of tp-rdzv-api."""

from __future__ import annotations

import importlib.metadata

import pytest

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousStoreInfo,
)
from tp_rdzv_api.registry import ENTRY_POINT_GROUP, create_handler, rendezvous_handler_registry
from tp_rdzv_example_backend import BACKEND, SoloRendezvousHandler
from tp_rdzv_example_backend import create_handler as create_solo


def _installed() -> bool:
    try:
        importlib.metadata.distribution("tp-rdzv-example-backend")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


installed = pytest.mark.skipif(
    not _installed(), reason="entry points need the example installed (nox -s example_backend)"
)


def _params(**overrides: object) -> RendezvousParameters:
    arguments: dict[str, object] = {"backend": BACKEND, "endpoint": "", "run_id": "job"}
    arguments.update(overrides)
    return RendezvousParameters(**arguments)  # type: ignore[arg-type]


@installed
def test_the_registry_creates_a_working_handler() -> None:
    handler = create_handler(_params(local_addr="127.0.0.1"))
    assert isinstance(handler, SoloRendezvousHandler)
    assert isinstance(handler, RendezvousHandler)
    assert handler.get_backend() == BACKEND
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    info.store.set("greeting", "hello")
    assert info.store.get("greeting") == b"hello"
    assert isinstance(info.bootstrap_store_info, RendezvousStoreInfo)
    assert info.bootstrap_store_info.master_addr == "127.0.0.1"
    assert handler.next_rendezvous().store.get("greeting") == b"hello"
    handler.set_closed()
    with pytest.raises(RendezvousClosedError):
        handler.next_rendezvous()


@installed
def test_the_backend_needs_nothing_but_the_api() -> None:
    dist = importlib.metadata.distribution("tp-rdzv-example-backend")
    assert [
        requirement.split(";")[0].strip()
        for requirement in dist.requires or []
        if "extra ==" not in requirement
    ] == ["tp-rdzv-api"]
    points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    assert [point.value for point in points if point.name == BACKEND] == [
        "tp_rdzv_example_backend:create_handler"
    ]
    assert BACKEND in rendezvous_handler_registry.names()


def test_handler_interface() -> None:
    handler = create_solo(_params())
    first, second = handler.next_rendezvous(), handler.next_rendezvous()
    assert first.bootstrap_store_info == second.bootstrap_store_info
    assert first.participants == ["127.0.0.1"]
    assert handler.get_run_id() == "job"
    assert handler.num_nodes_waiting() == 0
    assert handler.use_agent_store is False
    assert handler.is_closed() is False
    handler.pre_shutdown()
    assert handler.shutdown() is True
    assert handler.is_closed() is True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_nodes": 2}, "exactly one node"),
        ({"min_nodes": 2}, "exactly one node"),
        ({"node_rank": 1}, "only rank 0"),
        ({"endpoint": "localhost:29400"}, "takes no endpoint"),
    ],
)
def test_bad_parameters(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create_solo(_params(**overrides))
