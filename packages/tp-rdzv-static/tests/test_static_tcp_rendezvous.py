"""StaticTCPRendezvous in one process: both constructor forms, errors, closing, the registry."""

from __future__ import annotations

import importlib.metadata
import socket
import time
from datetime import timedelta
from typing import Any, ClassVar

import pytest

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousParameters,
    RendezvousTimeoutError,
    registry,
)
from tp_rdzv_static import (
    DEFAULT_PORT,
    StaticTCPRendezvous,
    create_handler,
    create_rdzv_handler,
    static_tcp_rendezvous,
)
from tp_store import PrefixStore


def _params(
    port: int, node_rank: int = 0, world_size: int = 2, **config: Any
) -> RendezvousParameters:
    return RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{port}",
        run_id="run",
        min_nodes=world_size,
        max_nodes=world_size,
        node_rank=node_rank,
        config=config,
    )


def _live(port: int, node_rank: int = 0, world_size: int = 2) -> RendezvousParameters:
    """Parameters for a real store, with a read timeout that fails a stuck test fast."""
    return _params(port, node_rank, world_size, read_timeout=20)


# -- the two constructor forms ------------------------------------------------------------


def test_parameters_form_two_ranks_share_the_store(free_port: int) -> None:
    host = StaticTCPRendezvous(_live(free_port, 0))
    guest = StaticTCPRendezvous(_live(free_port, 1))
    first, second = host.next_rendezvous(), guest.next_rendezvous()
    assert (first.rank, first.world_size) == (0, 2)
    assert (second.rank, second.world_size) == (1, 2)
    first.store.set("greeting", "hello")
    assert second.store.get("greeting") == b"hello"
    assert isinstance(second.store, PrefixStore)
    assert second.store.prefix == "run"
    assert first.bootstrap_store_info == second.bootstrap_store_info
    assert first.bootstrap_store_info is not None
    assert first.bootstrap_store_info.port == free_port


def test_host_name_form_with_a_free_port() -> None:
    host = StaticTCPRendezvous("127.0.0.1", None, rank=0, world_size=2, run_id="job", timeout=10)
    info = host.next_rendezvous()
    assert info.bootstrap_store_info is not None
    port = info.bootstrap_store_info.port
    assert port > 0
    guest = StaticTCPRendezvous("127.0.0.1", port, rank=1, world_size=2, run_id="job", timeout=10)
    other = guest.next_rendezvous()
    assert other.bootstrap_store_info == info.bootstrap_store_info
    other.store.set("k", b"v")
    assert info.store.get("k") == b"v"
    assert guest.get_run_id() == "job"


def test_handler_interface(free_port: int) -> None:
    handler = StaticTCPRendezvous(_live(free_port, 0, world_size=1))
    assert isinstance(handler, RendezvousHandler)
    assert handler.get_backend() == "static"
    assert handler.get_run_id() == "run"
    assert handler.use_agent_store is True
    assert handler.num_nodes_waiting() == 0
    assert handler.is_closed() is False
    handler.pre_shutdown()
    assert handler.shutdown() is True
    assert "rank=0" in repr(handler)


def test_next_rendezvous_again_returns_the_same_membership(free_port: int) -> None:
    host = StaticTCPRendezvous(_live(free_port, 0))
    guest = StaticTCPRendezvous(_live(free_port, 1))
    for handler in (host, guest):
        first, again = handler.next_rendezvous(), handler.next_rendezvous()
        assert (again.rank, again.world_size) == (first.rank, first.world_size)
        assert again.bootstrap_store_info == first.bootstrap_store_info
    host.next_rendezvous().store.set("key", "value")
    assert guest.next_rendezvous().store.get("key") == b"value"


def test_config_rank_overrides_node_rank(free_port: int) -> None:
    host = StaticTCPRendezvous(_live(free_port, 0))
    params = RendezvousParameters(
        backend="static",
        endpoint=f"127.0.0.1:{free_port}",
        run_id="run",
        max_nodes=2,
        node_rank=0,
        config={"rank": "1"},  # as torchrun passes it
    )
    guest = StaticTCPRendezvous(params)
    assert host.next_rendezvous().rank == 0
    assert guest.next_rendezvous().rank == 1


def test_closing_is_seen_by_every_rank(free_port: int) -> None:
    host = StaticTCPRendezvous(_live(free_port, 0))
    guest = StaticTCPRendezvous(_live(free_port, 1))
    host.next_rendezvous()
    guest.next_rendezvous()
    guest.set_closed()
    assert host.is_closed() is True
    assert guest.is_closed() is True
    with pytest.raises(RendezvousClosedError, match="closed"):
        host.next_rendezvous()


# -- what goes to the TCPStore -------------------------------------------------------------


class _RecordingStore:
    """Stands in for TCPStore and records its constructor arguments."""

    calls: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, host_name: str, port: int, **kwargs: Any) -> None:
        self.calls.append({"host": host_name, "port": port, **kwargs})
        self.port = port


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    _RecordingStore.calls = []
    monkeypatch.setattr(static_tcp_rendezvous, "TCPStore", _RecordingStore)
    return _RecordingStore.calls


def test_store_arguments_of_the_parameters_form(recorded: list[dict[str, Any]]) -> None:
    StaticTCPRendezvous(_params(1234, node_rank=0, world_size=3))
    StaticTCPRendezvous(_params(1234, node_rank=2, world_size=3))
    assert recorded == [
        {
            "host": "127.0.0.1",
            "port": 1234,
            "world_size": 3,
            "is_master": is_master,
            "timeout": 600.0,  # the join timeout by default
            "wait_for_workers": False,
            # No security keys: a plain store (or the secret in the environment).
            "tls_cert": None,
            "tls_key": None,
            "tls_ca": None,
            "tls_client_ca": None,
            "secret_file": None,
        }
        for is_master in (True, False)
    ]


def test_host_only_endpoint_uses_the_default_port(recorded: list[dict[str, Any]]) -> None:
    params = RendezvousParameters(backend="static", endpoint="node0", run_id="r", max_nodes=1)
    StaticTCPRendezvous(params)
    assert (recorded[0]["host"], recorded[0]["port"]) == ("node0", DEFAULT_PORT)
    assert DEFAULT_PORT == 29400


@pytest.mark.parametrize(
    ("config", "seconds"),
    [
        ({"read_timeout": 7}, 7.0),
        ({"read_timeout": "2.5"}, 2.5),
        ({"read_timeout": timedelta(seconds=3)}, 3.0),
        ({"timeout": "9"}, 9.0),
        ({"read_timeout": 1, "timeout": 9}, 1.0),
        ({"join_timeout": 42}, 42.0),
    ],
)
def test_read_timeout(
    recorded: list[dict[str, Any]], config: dict[str, Any], seconds: float
) -> None:
    StaticTCPRendezvous(_params(1234, **config))
    assert recorded[0]["timeout"] == seconds


def test_host_name_form_timeout(recorded: list[dict[str, Any]]) -> None:
    StaticTCPRendezvous("h", 1, rank=1, world_size=2)
    StaticTCPRendezvous("h", 1, rank=0, world_size=2, timeout=5)
    assert [call["timeout"] for call in recorded] == [600.0, 5.0]
    assert [call["is_master"] for call in recorded] == [False, True]


def test_start_daemon_false_makes_rank_0_a_client(recorded: list[dict[str, Any]]) -> None:
    StaticTCPRendezvous(_params(1234, node_rank=0, start_daemon="false"))
    assert recorded[0]["is_master"] is False


# -- clear errors --------------------------------------------------------------------------


def test_unreachable_endpoint_names_it(free_port: int) -> None:
    started = time.monotonic()
    with pytest.raises(RendezvousConnectionError) as caught:
        StaticTCPRendezvous(_params(free_port, node_rank=1, read_timeout=0.5))
    assert time.monotonic() - started < 10
    assert f"127.0.0.1:{free_port}" in str(caught.value)
    assert isinstance(caught.value, RendezvousError)
    assert isinstance(caught.value, ConnectionError)


def test_rank_0_never_publishing_is_a_timeout(free_port: int) -> None:
    host = StaticTCPRendezvous(_live(free_port, 0))
    guest = StaticTCPRendezvous(_params(free_port, node_rank=1, read_timeout=0.5))
    with pytest.raises(RendezvousTimeoutError, match=rf"rank 0 .*127\.0\.0\.1:{free_port}"):
        guest.next_rendezvous()
    host.next_rendezvous()
    assert guest.next_rendezvous().rank == 1


def test_taken_port_for_rank_0_names_it(free_port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", free_port))
        squatter.listen()
        with pytest.raises(RendezvousConnectionError, match=rf"bind .*127\.0\.0\.1:{free_port}"):
            StaticTCPRendezvous(_live(free_port, 0))


def test_unreachable_endpoint_in_host_name_form(free_port: int) -> None:
    with pytest.raises(RendezvousConnectionError, match=rf"127\.0\.0\.1:{free_port}"):
        StaticTCPRendezvous("127.0.0.1", free_port, rank=3, world_size=4, timeout=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 2, "world_size": 2}, r"rank 2 is out of range for a world size of 2"),
        ({"rank": -1, "world_size": 2}, r"rank -1 is out of range"),
        ({"rank": 0, "world_size": 0}, r"world size must be >= 1"),
        ({"rank": True, "world_size": 2}, r"'rank' must be an integer"),
        ({"rank": 0, "world_size": 2, "timeout": 0}, r"'timeout' must be positive"),
        ({"rank": 0, "world_size": 2, "timeout": "soon"}, r"'timeout' must be a number"),
    ],
)
def test_bad_host_name_form_arguments(
    recorded: list[dict[str, Any]], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        StaticTCPRendezvous("127.0.0.1", 1234, **kwargs)
    assert recorded == []


def test_a_client_needs_a_port(recorded: list[dict[str, Any]]) -> None:
    with pytest.raises(ValueError, match="rank 1 needs the port"):
        StaticTCPRendezvous("127.0.0.1", None, rank=1, world_size=2)
    with pytest.raises(ValueError, match=r"master_port must be in 0\.\.65535"):
        StaticTCPRendezvous("127.0.0.1", 70000, rank=0, world_size=2)
    assert recorded == []


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"read_timeout": "soon"}, "'read_timeout' must be a number"),
        ({"read_timeout": -1}, "'read_timeout' must be (positive|a finite number)"),
        ({"read_timeout": float("nan")}, "'read_timeout' must be (positive|a finite number)"),
        ({"timeout": True}, "'timeout' must be a timedelta or a number"),
        ({"rank": "one"}, "rank"),
        ({"rank": 5}, "rank 5 is out of range for a world size of 2"),
        ({"start_daemon": "perhaps"}, "start_daemon"),
    ],
)
def test_bad_parameters(
    recorded: list[dict[str, Any]], config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        StaticTCPRendezvous(_params(1234, **config))
    assert recorded == []


@pytest.mark.parametrize("run_id", [7, None, b"job"])
def test_host_name_form_run_id_must_be_a_str(recorded: list[dict[str, Any]], run_id: Any) -> None:
    with pytest.raises(TypeError, match=f"run_id must be a str, got {type(run_id).__name__}"):
        StaticTCPRendezvous("127.0.0.1", 1234, rank=0, world_size=2, run_id=run_id)
    assert recorded == []


def test_parameters_form_rejects_host_name_form_arguments() -> None:
    with pytest.raises(TypeError, match="come from the RendezvousParameters"):
        StaticTCPRendezvous(_params(1234), 1234)
    with pytest.raises(TypeError, match="come from the RendezvousParameters"):
        StaticTCPRendezvous(_params(1234), rank=1)
    with pytest.raises(TypeError, match="RendezvousParameters or a host name"):
        StaticTCPRendezvous(1234)  # type: ignore[arg-type]


def test_create_rdzv_handler_needs_an_endpoint() -> None:
    params = RendezvousParameters(backend="static", endpoint="  ", run_id="r")
    with pytest.raises(ValueError, match="endpoint is absent"):
        create_rdzv_handler(params)
    with pytest.raises(ValueError, match="endpoint is absent"):
        create_handler(params)


# -- the registry --------------------------------------------------------------------------


def _installed() -> bool:
    try:
        importlib.metadata.distribution("tp-rdzv-static")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed(), reason="entry points need tp-rdzv-static installed (nox)")
def test_entry_point_is_declared() -> None:
    points = importlib.metadata.entry_points(group="tensorplay.rendezvous.handlers")
    static = [point for point in points if point.name == "static"]
    assert [point.value for point in static] == ["tp_rdzv_static:create_handler"]
    assert static[0].load() is create_handler


@pytest.mark.skipif(not _installed(), reason="entry points need tp-rdzv-static installed (nox)")
def test_registry_creates_the_static_handler(free_port: int) -> None:
    handler = registry.create_handler(_live(free_port, 0, world_size=1))
    assert isinstance(handler, StaticTCPRendezvous)
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
