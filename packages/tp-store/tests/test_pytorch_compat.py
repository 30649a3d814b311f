"""Where PyTorch's store API behaves in a way users rely on, ours does the same.

Each test is one difference found by running PyTorch's own store tests against
us (issue 15): partial Python stores, PrefixStore's calls, ``libuvBackend``,
a master under PyTorch's elastic agent, timeout messages, ``FileStore.path``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tp_store import (
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    StoreConnectionError,
    StoreTimeoutError,
    TCPStore,
    UnsupportedOperationError,
)
from tp_store.base import as_bytes
from tp_store.protocol import EXTENSION_OFFER, encode_u32


class DictStore(Store):
    """A partial store as PyTorch's tests and users write one: set and get only."""

    def __init__(self) -> None:
        super().__init__(timeout=1)
        self.data: dict[object, bytes] = {}
        self.calls: list[tuple[str, object, object]] = []

    def set(self, key: str | bytes, value: str | bytes) -> None:
        self.calls.append(("set", key, value))
        self.data[key] = value if isinstance(value, bytes) else value.encode()

    def get(self, key: str | bytes) -> bytes:
        self.calls.append(("get", key, None))
        return self.data[key]


class ExtendedDictStore(DictStore):
    """A partial store that also implements the extended operations."""

    def append(self, key: str | bytes, value: str | bytes) -> None:
        self.data[key] = self.data.get(key, b"") + (value if isinstance(value, bytes) else b"")

    def multi_get(self, keys: object) -> list[bytes]:
        return [self.data[key] for key in keys]  # type: ignore[attr-defined]

    def multi_set(self, keys: object, values: object) -> None:
        for key, value in zip(keys, values, strict=True):  # type: ignore[call-overload]
            self.set(key, value)


class CompareSetDictStore(DictStore):
    """A partial store with set, get and compare_set only, as PyTorch's rule has it."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def compare_set(self, key: str | bytes, expected: str | bytes, desired: str | bytes) -> bytes:
        expected, desired = as_bytes(expected), as_bytes(desired)
        with self.lock:
            current = self.data.get(key)
            if current is None:
                if expected:
                    return expected
            elif current != expected:
                return current
            self.data[key] = desired
            return desired


@pytest.fixture
def server() -> Iterator[TCPStore]:
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=5)
    try:
        yield master
    finally:
        master.close()


# -- item 2: a partial Python store ------------------------------------------------------


def test_partial_store_can_be_created_and_used() -> None:
    store = DictStore()
    store.set("k", "v")
    assert store.get("k") == b"v"


@pytest.mark.parametrize(
    ("operation", "args"),
    [
        ("add", ("k", 1)),
        ("compare_set", ("k", "", "v")),
        ("wait", (["k"],)),
        ("check", (["k"],)),
        ("delete_key", ("k",)),
        ("num_keys", ()),
        ("append", ("k", "v")),
        ("list_keys", ()),
        ("queue_push", ("q", "v")),
        ("queue_pop", ("q",)),
        ("queue_len", ("q",)),
        ("clone", ()),
    ],
)
def test_missing_operations_raise_when_called(operation: str, args: tuple[object, ...]) -> None:
    message = f"DictStore does not implement {operation}"
    with pytest.raises(UnsupportedOperationError, match=message):
        getattr(DictStore(), operation)(*args)


def test_missing_operation_is_a_runtime_and_not_implemented_error() -> None:
    # PyTorch raises RuntimeError; NotImplementedError is what Python code expects.
    with pytest.raises(RuntimeError):
        DictStore().add("k", 1)
    with pytest.raises(NotImplementedError):
        DictStore().add("k", 1)


def test_partial_store_multi_get_and_multi_set_use_get_and_set() -> None:
    store = DictStore()
    store.multi_set(["a", "b"], ["1", "2"])
    assert store.multi_get(["a", "b"]) == [b"1", b"2"]
    assert [call[0] for call in store.calls] == ["set", "set", "get", "get"]


def test_partial_store_has_no_extended_api() -> None:
    assert DictStore().has_extended_api() is False
    assert PrefixStore("p", DictStore()).has_extended_api() is False


def test_store_implementing_the_extended_operations_has_the_extended_api() -> None:
    assert ExtendedDictStore().has_extended_api() is True


def test_our_stores_have_the_extended_api(server: TCPStore, tmp_path: Path) -> None:
    for store in (server, HashStore(), FileStore(tmp_path / "f"), PrefixStore("p", HashStore())):
        assert store.has_extended_api() is True, store


# -- item 2: what PrefixStore passes to the store under it -------------------------------


def test_prefix_store_passes_str_keys_and_bytes_values() -> None:
    inner = DictStore()
    prefixed = PrefixStore("p", inner)
    prefixed.set("foo", "bar")
    assert prefixed.get("foo") == b"bar"
    assert inner.calls == [("set", "p/foo", b"bar"), ("get", "p/foo", None)]


def test_prefix_store_passes_bytes_keys_as_bytes() -> None:
    inner = DictStore()
    PrefixStore("p", inner).set(b"\xff", b"v")
    assert inner.calls == [("set", b"p/\xff", b"v")]


def test_nested_prefix_stores_reach_the_server_as_one_key(server: TCPStore) -> None:
    PrefixStore("a", PrefixStore("b", server)).set("k", "v")
    assert server.get("b/a/k") == b"v"


# -- item 7: PrefixStore over nothing ---------------------------------------------------


def test_prefix_store_over_none_is_a_value_error_at_once() -> None:
    with pytest.raises(ValueError, match="cannot be None"):
        PrefixStore("p", None)  # type: ignore[arg-type]


def test_prefix_store_over_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"needs a tp_store\.Store"):
        PrefixStore("p", 5)  # type: ignore[arg-type]


# -- item 3: libuvBackend -----------------------------------------------------------------


@pytest.mark.parametrize("use_libuv", [True, False])
def test_libuv_backend_reports_the_flag_as_pytorch(server: TCPStore, use_libuv: bool) -> None:
    client = TCPStore("127.0.0.1", server.port, use_libuv=use_libuv, timeout=5)
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=use_libuv)
    try:
        assert client.libuvBackend is use_libuv
        assert master.libuvBackend is use_libuv
    finally:
        client.close()
        master.close()


def test_libuv_backend_is_true_by_default(server: TCPStore) -> None:
    assert server.libuvBackend is True


# -- item 9: a master under PyTorch's elastic agent -----------------------------------------


def agent_env(monkeypatch: pytest.MonkeyPatch, flag: str, port: int | str) -> None:
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", flag)
    monkeypatch.setenv("MASTER_PORT", str(port))


@pytest.mark.parametrize("flag", ["True", "1", "true", "yes", "y", "t"])
def test_master_under_the_agent_uses_the_agents_store(
    server: TCPStore, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    agent_env(monkeypatch, flag, server.port)
    worker = TCPStore("127.0.0.1", server.port, is_master=True, wait_for_workers=False, timeout=5)
    try:
        assert worker.server is None
        worker.set("from-worker", "1")
        assert server.get("from-worker") == b"1"
    finally:
        worker.close()
    assert server.check(["from-worker"])  # closing the worker left the agent's server up


def test_master_under_the_agent_counts_itself_in_without_waiting(
    server: TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As PyTorch: only a master that hosts the server waits for world_size users.
    agent_env(monkeypatch, "True", server.port)
    worker = TCPStore("127.0.0.1", server.port, world_size=2, is_master=True, timeout=5)
    try:
        assert server.server is not None
        assert server.server.state.get(b"init/") == b"1"
    finally:
        worker.close()


@pytest.mark.parametrize(("flag", "port_offset"), [("False", 0), ("0", 0), ("no", 0), ("True", 1)])
def test_master_without_the_agent_fails_to_bind_a_taken_port(
    server: TCPStore, monkeypatch: pytest.MonkeyPatch, flag: str, port_offset: int
) -> None:
    agent_env(monkeypatch, flag, server.port + port_offset)
    with pytest.raises(StoreConnectionError, match="cannot start the store server"):
        TCPStore("127.0.0.1", server.port, is_master=True, wait_for_workers=False, timeout=1)


def test_master_with_no_agent_variables_fails_to_bind_a_taken_port(
    server: TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    with pytest.raises(StoreConnectionError, match="cannot start the store server"):
        TCPStore("127.0.0.1", server.port, is_master=True, wait_for_workers=False, timeout=1)


@pytest.mark.parametrize(
    ("flag", "port", "name"),
    [("maybe", None, "TORCHELASTIC_USE_AGENT_STORE"), ("True", "x", "MASTER_PORT")],
)
def test_bad_agent_variables_are_named(
    server: TCPStore, monkeypatch: pytest.MonkeyPatch, flag: str, port: str | None, name: str
) -> None:
    agent_env(monkeypatch, flag, server.port if port is None else port)
    with pytest.raises(ValueError, match=name):
        TCPStore("127.0.0.1", server.port, is_master=True, wait_for_workers=False, timeout=1)


def test_master_on_a_free_port_ignores_the_agent_variables(
    server: TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent_env(monkeypatch, "maybe", server.port)  # read only when binding fails
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        assert master.server is not None
    finally:
        master.close()


# -- item 10: timeout messages say so -------------------------------------------------------


def _silent_server() -> tuple[socket.socket, threading.Event]:
    """A server that answers the handshake as PyTorch's would, then never again."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(1024)  # VALIDATE and PING
            connection.sendall(encode_u32(EXTENSION_OFFER))
            done.wait(30)

    threading.Thread(target=serve, daemon=True).start()
    return listener, done


def test_a_store_that_does_not_answer_times_out_saying_so() -> None:
    listener, done = _silent_server()
    try:
        client = TCPStore("127.0.0.1", listener.getsockname()[1], timeout=0.3)
        with pytest.raises(StoreTimeoutError, match="timed out"):
            client.add("k", 1)
    finally:
        done.set()
        listener.close()


def _stores(server: TCPStore, tmp_path: Path) -> list[Store]:
    return [
        TCPStore("127.0.0.1", server.port, timeout=0.2),
        HashStore(0.2),
        FileStore(tmp_path / "f", timeout=0.2),
        PrefixStore("p", HashStore(0.2)),
    ]


@pytest.mark.parametrize("operation", ["get", "wait", "wait_get", "queue_pop", "barrier"])
def test_every_blocking_operation_times_out_saying_so(
    server: TCPStore, tmp_path: Path, operation: str
) -> None:
    calls = {
        "get": lambda s: s.get("missing"),
        "wait": lambda s: s.wait(["missing"]),
        "wait_get": lambda s: s.wait_get("missing", 0.2),
        "queue_pop": lambda s: s.queue_pop("missing"),
        "barrier": lambda s: s.barrier("missing", 2, 0.2),
    }
    for store in _stores(server, tmp_path):
        with pytest.raises(StoreTimeoutError, match="timed out") as caught:
            calls[operation](store)
        assert isinstance(caught.value, TimeoutError)
        store.close()


def test_connecting_in_vain_says_timed_out() -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(StoreConnectionError, match="timed out after"):
        TCPStore("127.0.0.1", port, timeout=0.3)


def test_master_waiting_for_workers_times_out_saying_so() -> None:
    with pytest.raises(StoreTimeoutError, match="timed out"):
        TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=0.2)


# -- item 11: FileStore.path -----------------------------------------------------------------


def test_file_store_path_is_the_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "shared")
    assert store.path == str(tmp_path / "shared") == store.file_name


# -- append from compare_set, as PyTorch builds it -----------------------------------------


def test_append_falls_back_to_compare_set() -> None:
    store = CompareSetDictStore()
    store.append("k", "ab")
    store.append("k", b"cd")
    assert store.data["k"] == b"abcd"


def test_append_to_a_key_holding_exactly_the_value_appends() -> None:
    # PyTorch's loop starts with compare_set(key, "", value) and takes the answer
    # "value" as done: an append to a key that already holds it is lost there.
    store = CompareSetDictStore()
    store.set("k", "ab")
    store.append("k", "ab")
    assert store.data["k"] == b"abab"


def test_append_to_an_empty_value() -> None:
    store = CompareSetDictStore()
    store.set("k", "")
    store.append("k", "x")
    assert store.data["k"] == b"x"


def test_concurrent_appends_through_the_fallback_all_land() -> None:
    store = CompareSetDictStore()
    values = [f"<{n}>".encode() for n in range(200)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda value: store.append("k", value), values))
    held = store.data["k"]
    assert len(held) == sum(map(len, values))
    assert all(value in held for value in values)
