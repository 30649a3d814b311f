"""One contract, both store backends, every store: ``RendezvousBackend`` compare-and-set.

Each test runs against ``TpRendezvousBackend`` and ``P10dRendezvousBackend`` on
a real ``TCPStore`` server, a ``FileStore`` and a ``HashStore``, through the
``harness`` fixture, which opens further handles on the same data (a new
client connection, a new ``FileStore`` on the same file, a clone) so that a
test can play several nodes.
"""

from __future__ import annotations

import base64
import itertools
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tp_rdzv_api import RendezvousConnectionError, RendezvousStateError
from tp_rdzv_dynamic.backends.backend import RendezvousBackend
from tp_rdzv_dynamic.backends.p10d_backend import P10dRendezvousBackend
from tp_rdzv_dynamic.backends.tp_backend import TpRendezvousBackend
from tp_store import FileStore, HashStore, Store, StoreConnectionError, StoreError, TCPStore

#: Default timeout of the stores: a get_state that blocked would fail with it.
TIMEOUT = 5.0
#: The timeout of stores that a test makes fail.
SHORT = 1.0

StoreBackend = TpRendezvousBackend | P10dRendezvousBackend
BACKENDS: dict[str, Callable[[Store, str], StoreBackend]] = {
    "core": TpRendezvousBackend,
    "p10d": P10dRendezvousBackend,
}
#: The documented layout: where each backend keeps the document of run ``{}``.
KEYS = {"core": "tp_rdzv/{}/state", "p10d": "torch.rendezvous.{}"}
#: How each backend encodes a document in its key.
ENCODINGS: dict[str, Callable[[bytes], bytes]] = {
    "core": lambda doc: doc,
    "p10d": base64.b64encode,
}
#: PyTorch's c10d placeholder for "no state yet".
P10D_PLACEHOLDER = b"Y2FuaW1hZGFt"
STORES = ("tcp", "file", "hash")


@dataclass
class Harness:
    """A backend class under test, on a store kind, and the means to open handles."""

    backend_name: str
    kind: str
    #: Opens another handle on the same data with the given timeout.
    opener: Callable[[float], Store]
    master: TCPStore | None = None
    handles: list[Store] = field(default_factory=list)

    def store(self, timeout: float = TIMEOUT) -> Store:
        """Another handle on the same data (a new connection for TCP), closed at the end."""
        handle = self.opener(timeout)
        self.handles.append(handle)
        return handle

    def backend(self, run_id: str = "run", store: Store | None = None) -> StoreBackend:
        """A backend for ``run_id`` on ``store``, or on a new handle."""
        return BACKENDS[self.backend_name](store or self.store(), run_id)

    def key(self, run_id: str = "run") -> str:
        """The store key of the document of ``run_id``."""
        return KEYS[self.backend_name].format(run_id)

    def encode(self, doc: bytes) -> bytes:
        """The value the backend stores for ``doc``."""
        return ENCODINGS[self.backend_name](doc)


def _build(backend_name: str, kind: str, tmp_path: Path) -> Harness:
    if kind == "tcp":
        master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
        port = master.port
        return Harness(backend_name, kind, lambda t: TCPStore("127.0.0.1", port, timeout=t), master)
    if kind == "file":
        path = tmp_path / "store"
        return Harness(backend_name, kind, lambda t: FileStore(path, 1, timeout=t))
    hash_store = HashStore(TIMEOUT)

    def clone(timeout: float) -> Store:
        twin = hash_store.clone()
        twin.set_timeout(timeout)
        return twin

    return Harness(backend_name, kind, clone)


def combos(backends: tuple[str, ...] = tuple(BACKENDS), stores: tuple[str, ...] = STORES) -> Any:
    """Parameters of the ``harness`` fixture: every backend on every store, by default."""
    return [pytest.param((b, s), id=f"{b}-{s}") for b, s in itertools.product(backends, stores)]


@pytest.fixture(params=combos())
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A backend class and a store kind (``parametrize(..., indirect=True)`` narrows them)."""
    backend_name, kind = request.param
    built = _build(backend_name, kind, tmp_path)
    try:
        yield built
    finally:
        for handle in built.handles:
            handle.close()
        if built.master is not None:
            built.master.close()


def write(backend: RendezvousBackend, state: bytes, token: Any = None) -> tuple[bytes, Any, bool]:
    """``set_state`` where something must be stored afterwards."""
    result = backend.set_state(state, token)
    assert result is not None
    return result


def read(backend: RendezvousBackend) -> tuple[bytes, Any]:
    """``get_state`` where something must be stored."""
    result = backend.get_state()
    assert result is not None
    return result


# -- identity and layout ------------------------------------------------------------


def test_name_is_the_registry_name(harness: Harness) -> None:
    assert harness.backend().name == harness.backend_name


def test_key_is_the_documented_key(harness: Harness) -> None:
    assert harness.backend("job-7").key == harness.key("job-7")


def test_document_lives_at_the_documented_key_and_encoding(harness: Harness) -> None:
    store = harness.store()
    backend = harness.backend(store=store)
    doc = b'{"version": 1}'
    write(backend, doc)
    assert store.get(harness.key()) == harness.encode(doc)


def test_reads_a_document_written_directly_in_the_layout(harness: Harness) -> None:
    store = harness.store()
    backend = harness.backend(store=store)
    store.set(harness.key(), harness.encode(b"written by a peer"))
    assert backend.get_state() == (b"written by a peer", harness.encode(b"written by a peer"))


@pytest.mark.parametrize("harness", combos(backends=("p10d",)), indirect=True)
def test_p10d_creates_pytorchs_placeholder(harness: Harness) -> None:
    store = harness.store()
    harness.backend(store=store).get_state()
    assert store.get(harness.key()) == P10D_PLACEHOLDER


def test_construction_and_read_state_write_nothing(harness: Harness) -> None:
    store = harness.store()
    before = sorted(store.list_keys())
    backend = harness.backend(store=store)
    assert backend.read_state() is None
    assert sorted(store.list_keys()) == before
    write(backend, b"A")
    assert backend.read_state() == backend.get_state()


# -- reading --------------------------------------------------------------------------


def test_get_state_is_none_before_any_write(harness: Harness) -> None:
    assert harness.backend().get_state() is None


def test_get_state_does_not_block_when_the_key_is_missing(harness: Harness) -> None:
    # Store.get would wait for the key until the store timeout, which the
    # backend would report as RendezvousConnectionError.
    store = harness.store()
    backend = harness.backend(store=store)
    store.delete_key(harness.key())
    assert backend.get_state() is None


def test_empty_value_reads_as_no_document_and_can_be_replaced(harness: Harness) -> None:
    store = harness.store()
    backend = harness.backend(store=store)
    store.set(harness.key(), b"")
    assert backend.set_state(b"A", b"stale token") is None
    assert backend.get_state() is None
    assert write(backend, b"A")[::2] == (b"A", True)


# -- compare-and-set ------------------------------------------------------------------


@pytest.mark.parametrize("no_token", [None, b""], ids=["None", "empty"])
def test_first_write_wins_and_returns_a_working_token(harness: Harness, no_token: Any) -> None:
    backend = harness.backend()
    state, token, won = write(backend, b"A", no_token)
    assert (state, won) == (b"A", True)
    assert backend.get_state() == (b"A", token)
    assert write(backend, b"B", token)[::2] == (b"B", True)


def test_second_first_write_loses_and_sees_the_winner(harness: Harness) -> None:
    first, second = harness.backend(), harness.backend()
    _, token, _ = write(first, b"A")
    assert write(second, b"B") == (b"A", token, False)
    assert first.get_state() == (b"A", token)


def test_stale_token_loses_and_fresh_token_wins(harness: Harness) -> None:
    backend = harness.backend()
    _, stale, _ = write(backend, b"A")
    _, fresh, won = write(backend, b"B", stale)
    assert won
    assert write(backend, b"C", stale) == (b"B", fresh, False)
    assert write(backend, b"C", fresh)[::2] == (b"C", True)
    assert read(backend)[0] == b"C"


def test_token_from_get_state_wins(harness: Harness) -> None:
    writer, reader = harness.backend(), harness.backend()
    write(writer, b"A")
    doc, token = read(reader)
    assert doc == b"A"
    assert write(reader, b"B", token)[::2] == (b"B", True)
    assert read(writer)[0] == b"B"


def test_writing_the_stored_document_reports_success_whatever_the_token(harness: Harness) -> None:
    # compare_set cannot tell "I wrote it" from "it was already there": both
    # backends report success whenever the stored document is the one written.
    backend = harness.backend()
    _, stale, _ = write(backend, b"A")
    _, current, _ = write(backend, b"B", stale)
    assert write(backend, b"B", stale) == (b"B", current, True)
    assert write(backend, b"B") == (b"B", current, True)


@pytest.mark.parametrize("foreign", ["text", 42, object()])
def test_token_this_backend_never_issued_loses(harness: Harness, foreign: object) -> None:
    backend = harness.backend()
    assert backend.set_state(b"B", foreign) is None
    _, token, _ = write(backend, b"A")
    assert write(backend, b"B", foreign) == (b"A", token, False)


def test_token_as_text_loses_even_when_it_spells_the_stored_value(harness: Harness) -> None:
    backend = harness.backend()
    _, token, _ = write(backend, b"A")
    assert write(backend, b"B", token.decode()) == (b"A", token, False)


def test_key_deleted_behind_the_backend(harness: Harness) -> None:
    store = harness.store()
    backend = harness.backend(store=store)
    _, stale, _ = write(backend, b"A")
    store.delete_key(harness.key())
    assert backend.get_state() is None
    store.delete_key(harness.key())
    assert backend.set_state(b"B", stale) is None  # nothing is stored: not "A" again
    store.delete_key(harness.key())
    assert write(backend, b"B")[::2] == (b"B", True)


# -- several nodes --------------------------------------------------------------------


def test_backends_on_separate_connections_see_each_others_writes(harness: Harness) -> None:
    one, two = harness.backend(store=harness.store()), harness.backend(store=harness.store())
    _, token, _ = write(one, b"from one")
    assert two.get_state() == (b"from one", token)
    _, token, _ = write(two, b"from two", token)
    assert one.get_state() == (b"from two", token)


@pytest.mark.parametrize("seeded", [False, True], ids=["first-write", "with-token"])
def test_exactly_one_of_racing_writers_wins(harness: Harness, seeded: bool) -> None:
    writers = [harness.backend(store=harness.store()) for _ in range(8)]
    token = write(writers[0], b"seed")[1] if seeded else None
    start = threading.Barrier(len(writers))
    results: list[Any] = [None] * len(writers)

    def race(index: int) -> None:
        start.wait()
        results[index] = writers[index].set_state(f"writer {index}".encode(), token)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(writers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [i for i, result in enumerate(results) if result is not None and result[2]]
    assert len(winners) == 1
    stored = f"writer {winners[0]}".encode()
    assert {result[0] for result in results} == {stored}
    assert read(writers[0])[0] == stored


def test_clone_works_on_the_same_document(harness: Harness) -> None:
    backend = harness.backend()
    twin = backend.clone()
    try:
        assert (type(twin), twin.key) == (type(backend), backend.key)
        _, token, _ = write(backend, b"A")
        assert read(twin) == (b"A", token)
        _, token, _ = write(twin, b"B", token)
        assert read(backend) == (b"B", token)
    finally:
        twin.close()


def test_clone_does_not_wait_behind_a_blocking_call_on_the_original(harness: Harness) -> None:
    # The steward's reason to clone: another thread may block on the original
    # store handle. Were the clone to share it, its write would queue behind
    # the wait below until that wait timed out.
    store = harness.store()
    twin = harness.backend(store=store).clone()
    started = threading.Event()
    outcome: list[object] = []

    def wait_for_release() -> None:
        started.set()
        try:
            store.wait(["release"])
            outcome.append("released")
        except StoreError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_for_release)
    waiter.start()
    started.wait()
    try:
        write(twin, b"A")
        harness.store().set("release", b"1")
    finally:
        waiter.join()
        twin.close()
    assert outcome == ["released"]


def test_close_leaves_the_callers_store_open(harness: Harness) -> None:
    store = harness.store()
    backend = harness.backend(store=store)
    backend.close()
    store.set("still", b"open")
    assert write(backend, b"A")[::2] == (b"A", True)


@pytest.mark.parametrize("harness", combos(stores=("file",)), indirect=True)
def test_close_of_a_clone_closes_the_handle_it_opened(harness: Harness) -> None:
    # Only a FileStore handle stays unusable once closed (a TCP client reconnects).
    twin = harness.backend().clone()
    twin.close()
    with pytest.raises(RendezvousConnectionError, match=harness.key()):
        twin.get_state()


# -- documents ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        os.urandom(1 << 20),
        bytes(range(256)) * 4 + b"\xff\xfe\x00",
        "é\u2028".encode(),
        P10D_PLACEHOLDER,  # one backend's "nothing stored" is a plain document to the other
    ],
    ids=["1MB-random", "all-bytes", "utf8", "p10d-placeholder"],
)
def test_documents_round_trip_between_nodes(harness: Harness, doc: bytes) -> None:
    writer, reader = harness.backend(), harness.backend()
    assert write(writer, doc)[::2] == (doc, True)
    assert read(reader)[0] == doc


@pytest.mark.parametrize(
    ("harness", "doc"),
    [
        *[pytest.param(c.values[0], b"", id=f"{c.id}-empty") for c in combos()],
        *[
            pytest.param(c.values[0], b"canimadam", id=f"{c.id}-b64-is-placeholder")
            for c in combos(backends=("p10d",))
        ],
    ],
    indirect=["harness"],
)
def test_document_that_reads_back_as_nothing_is_refused(harness: Harness, doc: bytes) -> None:
    backend = harness.backend()
    with pytest.raises(ValueError, match="no document"):
        backend.set_state(doc)
    assert backend.get_state() is None


@pytest.mark.parametrize("state", ["text", bytearray(b"A"), None])
def test_state_must_be_bytes(harness: Harness, state: object) -> None:
    with pytest.raises(TypeError, match="state must be bytes"):
        harness.backend().set_state(state)  # type: ignore[arg-type]


def test_run_ids_do_not_interfere(harness: Harness) -> None:
    store = harness.store()
    first, second = harness.backend("job-a", store), harness.backend("job-b", store)
    _, token_a, _ = write(first, b"A")
    assert second.get_state() is None
    assert second.set_state(b"B", token_a) is None
    _, token_b, won = write(second, b"B")
    assert won
    assert first.get_state() == (b"A", token_a)
    assert second.get_state() == (b"B", token_b)


# -- values the backend did not write -------------------------------------------------


@pytest.mark.parametrize("harness", combos(backends=("p10d",)), indirect=True)
@pytest.mark.parametrize("value", [b"not base64!", b"QQ", "é".encode()])
def test_p10d_value_that_is_not_base64_is_a_state_error(harness: Harness, value: bytes) -> None:
    store = harness.store()
    backend = harness.backend(store=store)
    store.set(harness.key(), value)
    with pytest.raises(RendezvousStateError, match=harness.key()):
        backend.get_state()
    with pytest.raises(RendezvousStateError, match=harness.key()):
        backend.set_state(b"B", b"stale token")


@pytest.mark.parametrize("harness", combos(backends=("core",)), indirect=True)
def test_core_hands_back_any_value_verbatim(harness: Harness) -> None:
    # Every byte string is a core document: judging its content is the state
    # codec's job, so a foreign value reads back as is, and its token works.
    store = harness.store()
    backend = harness.backend(store=store)
    store.set(harness.key(), b"\x80not json\x00")
    assert backend.get_state() == (b"\x80not json\x00", b"\x80not json\x00")
    assert write(backend, b"B", b"\x80not json\x00")[::2] == (b"B", True)


# -- store failures -------------------------------------------------------------------


def _cut_off(harness: Harness, store: Store) -> None:
    """Make ``store`` unusable: stop the TCP server, or close the FileStore handle."""
    if harness.master is not None:
        harness.master.close()
    else:
        store.close()


@pytest.mark.parametrize("harness", combos(stores=("tcp", "file")), indirect=True)
def test_unreachable_store_is_a_connection_error(harness: Harness) -> None:
    store = harness.store(SHORT)
    backend = harness.backend(store=store)
    _, token, _ = write(backend, b"A")
    _cut_off(harness, store)
    for operation in (backend.get_state, lambda: backend.set_state(b"B", token)):
        with pytest.raises(RendezvousConnectionError, match=harness.key()) as caught:
            operation()
        assert "'run'" in str(caught.value)
        assert isinstance(caught.value.__cause__, StoreError)


class _Relay:
    """A TCP relay to a store server that can stop relaying requests (the server looks hung)."""

    def __init__(self, upstream_port: int) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._upstream_port = upstream_port
        self.relaying = threading.Event()
        self.relaying.set()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept_one, daemon=True).start()

    def _accept_one(self) -> None:
        client, _ = self._listener.accept()
        server = socket.create_connection(("127.0.0.1", self._upstream_port))
        self._sockets += [client, server]
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                if self.relaying.is_set():
                    sink.sendall(data)
        except OSError:
            pass  # the test closed the relay

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


@pytest.mark.parametrize("harness", combos(stores=("tcp",)), indirect=True)
def test_store_that_does_not_answer_is_a_connection_error(harness: Harness) -> None:
    assert harness.master is not None
    relay = _Relay(harness.master.port)
    try:
        store = TCPStore("127.0.0.1", relay.port, timeout=SHORT)
        harness.handles.append(store)
        backend = harness.backend(store=store)
        relay.relaying.clear()
        with pytest.raises(RendezvousConnectionError, match=harness.key()) as caught:
            backend.get_state()
        assert isinstance(caught.value.__cause__, TimeoutError)
        assert not isinstance(caught.value.__cause__, StoreConnectionError)
    finally:
        relay.close()


@pytest.mark.parametrize("harness", combos(stores=("tcp", "file")), indirect=True)
def test_construction_on_an_unreachable_store_is_a_connection_error(harness: Harness) -> None:
    store = harness.store(SHORT)
    _cut_off(harness, store)
    with pytest.raises(RendezvousConnectionError, match=harness.key()):
        harness.backend(store=store)


# -- bad arguments --------------------------------------------------------------------


@pytest.mark.parametrize("backend_class", BACKENDS.values(), ids=BACKENDS.keys())
@pytest.mark.parametrize("run_id", ["", "a/b", "a b", "run\n", "ru*n", "é", "a:b"])
def test_bad_run_id_is_a_value_error(backend_class: type[Any], run_id: str) -> None:
    with pytest.raises(ValueError, match="run_id"):
        backend_class(HashStore(TIMEOUT), run_id)


@pytest.mark.parametrize("backend_class", BACKENDS.values(), ids=BACKENDS.keys())
@pytest.mark.parametrize("run_id", [None, 7, b"run"])
def test_run_id_that_is_not_a_str_is_a_type_error(backend_class: type[Any], run_id: object) -> None:
    with pytest.raises(TypeError, match="run_id"):
        backend_class(HashStore(TIMEOUT), run_id)


@pytest.mark.parametrize("backend_class", BACKENDS.values(), ids=BACKENDS.keys())
def test_run_id_of_the_documented_characters_is_accepted(backend_class: type[Any]) -> None:
    backend = backend_class(HashStore(TIMEOUT), "Job-1.retry_2")
    assert backend.get_state() is None


@pytest.mark.parametrize("backend_class", BACKENDS.values(), ids=BACKENDS.keys())
@pytest.mark.parametrize("store", [None, "127.0.0.1:29400", {}])
def test_store_that_is_not_a_store_is_a_type_error(backend_class: type[Any], store: object) -> None:
    with pytest.raises(TypeError, match="store"):
        backend_class(store, "run")
