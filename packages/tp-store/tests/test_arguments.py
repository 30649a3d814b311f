"""Bad arguments to the stores' constructors are refused at once, naming the argument.

A real master serves on loopback, so an argument that slipped through would
get a working store instead of the error.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tp_store import FileStore, HashStore, TCPStore

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def master() -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    yield store
    store.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"world_size": "2"}, TypeError, "world_size"),
        ({"world_size": 2.5}, TypeError, "world_size"),
        ({"world_size": 1.0}, TypeError, "world_size"),
        ({"world_size": True}, TypeError, "world_size"),
        ({"world_size": 2**63}, ValueError, "world_size"),
        ({"timeout": "5"}, TypeError, "timeout"),
        ({"timeout": True}, TypeError, "timeout"),
        ({"timeout": 1e300}, ValueError, "timeout"),
        ({"is_master": "no"}, TypeError, "is_master"),
        ({"wait_for_workers": 0}, TypeError, "wait_for_workers"),
        ({"multi_tenant": None}, TypeError, "multi_tenant"),
        ({"use_libuv": 1}, TypeError, "use_libuv"),
    ],
)
def test_tcp_store_refuses_a_bad_argument_naming_it(
    master: TCPStore, kwargs: dict[str, object], error: type[Exception], name: str
) -> None:
    arguments: dict[str, object] = {"timeout": TIMEOUT, "wait_for_workers": False, **kwargs}
    with pytest.raises(error, match=name):
        TCPStore("127.0.0.1", master.port, **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("port", ["PORT", 1.0, True])
def test_tcp_store_refuses_a_port_that_is_not_an_int_naming_it(
    master: TCPStore, port: object
) -> None:
    given = str(master.port) if port == "PORT" else port
    with pytest.raises(TypeError, match="port"):
        TCPStore("127.0.0.1", given, timeout=TIMEOUT)  # type: ignore[arg-type]


def test_tcp_store_refuses_a_host_name_that_is_not_a_str(master: TCPStore) -> None:
    with pytest.raises(TypeError, match="host_name"):
        TCPStore(b"127.0.0.1", master.port, timeout=TIMEOUT)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("world_size", "error"), [("2", TypeError), (2.5, TypeError), (True, TypeError)]
)
def test_file_store_refuses_a_world_size_that_is_not_an_int(
    tmp_path: Path, world_size: object, error: type[Exception]
) -> None:
    with pytest.raises(error, match="world_size"):
        FileStore(tmp_path / "store", world_size)  # type: ignore[arg-type]
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("timeout", [1e300, 10**400], ids=["float", "int"])
def test_a_timeout_too_large_for_a_timedelta_is_a_value_error_naming_it(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be at most"):
        HashStore(timeout)
    with pytest.raises(ValueError, match="timeout must be at most"):
        HashStore().set_timeout(timeout)
