"""PyTorch's behaviours a migrating user relies on (issue 15), on real stores on loopback.

A backend whose ``set_state`` answers ``None`` (PyTorch's type allows it, its
own test backend does it), status reading without writing, and the codec of
PyTorch's c10d state (checked against real PyTorch in tests/interop).
"""

from __future__ import annotations

import base64
import os
import pickle
import pickletools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from tp_rdzv_api import (
    RendezvousError,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousTimeout,
    create_handler,
)
from tp_rdzv_dynamic import DynamicRendezvousHandler, RendezvousBackend, Token
from tp_rdzv_dynamic.documents.layout import torch_state_key
from tp_rdzv_dynamic.torch_compat.torch_c10d import TorchC10dRun
from tp_rdzv_dynamic.torch_compat.torch_state import (
    TORCH_MODULE,
    TORCH_VACANT,
    TorchNode,
    TorchRendezvousState,
    decode_torch_state,
    encode_torch_state,
)
from tp_store import TCPStore

RUN = "job"


class InMemoryBackend(RendezvousBackend):
    """PyTorch's test backend, in our names: ``set_state`` always answers ``None``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: bytes | None = None
        self._token: int | None = None

    @property
    def name(self) -> str:
        return "in-memory"

    def get_state(self) -> tuple[bytes, Token] | None:
        with self._lock:
            return None if self._state is None else (self._state, self._token)

    def set_state(self, state: bytes, token: Token | None = None) -> None:  # type: ignore[override]
        with self._lock:
            if self._token != token:
                return
            self._state = state
            self._token = 0 if self._token is None else self._token + 1


class StatelessBackend(InMemoryBackend):
    """A backend that keeps nothing: ``set_state`` answers ``None`` and stores nothing."""

    def set_state(self, state: bytes, token: Token | None = None) -> None:  # type: ignore[override]
        return None


@pytest.fixture
def server() -> Iterator[TCPStore]:
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=10)
    yield master
    master.close()


def _node(server: TCPStore, backend: RendezvousBackend, size: int) -> DynamicRendezvousHandler:
    store = TCPStore("127.0.0.1", server.port, timeout=10)
    return DynamicRendezvousHandler.from_backend(
        RUN,
        store,
        backend,
        size,
        size,
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(join=60, last_call=0.2),
        keep_alive_interval=0.5,
    )


@pytest.mark.parametrize("size", [1, 3])
def test_backend_whose_set_state_answers_none_completes_rounds(server: TCPStore, size: int) -> None:
    backend = InMemoryBackend()
    handlers = [_node(server, backend, size) for _ in range(size)]
    try:
        with ThreadPoolExecutor(size) as pool:
            infos = list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
        assert sorted(info.rank for info in infos) == list(range(size))
        assert {info.world_size for info in infos} == {size}
    finally:
        for handler in handlers:
            handler.shutdown()


def test_backend_that_stores_nothing_still_completes_a_round(server: TCPStore) -> None:
    # PyTorch's nodes go on with their local state: rank 0 of 1 at once. Ours timed out.
    handler = _node(server, StatelessBackend(), 1)
    try:
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
    finally:
        handler.shutdown()


# -- status writes nothing ----------------------------------------------------------------


def _observer(backend: str, port: int, run_id: str) -> DynamicRendezvousHandler:
    handler = create_handler(
        RendezvousParameters(
            backend, f"127.0.0.1:{port}", run_id, config={"is_host": False, "read_timeout": 5}
        )
    )
    assert isinstance(handler, DynamicRendezvousHandler)
    return handler


@pytest.mark.parametrize("backend", ["core", "c10d", "p10d"])
def test_status_of_a_run_that_does_not_exist_writes_nothing(server: TCPStore, backend: str) -> None:
    before = sorted(server.list_keys())
    status = _observer(backend, server.port, "nobody").status()
    assert not status.exists
    assert (status.round, status.participants) == (0, ())
    assert sorted(server.list_keys()) == before


@pytest.mark.parametrize("backend", ["core", "c10d", "p10d"])
def test_status_of_a_running_job_writes_nothing(server: TCPStore, backend: str) -> None:
    node = _observer(backend, server.port, RUN)
    node.next_rendezvous()
    try:
        node._heartbeats.stop()  # nothing else may write while the keys are compared
        node._office.stop()
        before = {key: server.get(key) for key in server.list_keys()}
        status = _observer(backend, server.port, RUN).status()
        assert status.exists
        assert status.complete
        assert [n.rank for n in status.participants] == [0]
        assert {key: server.get(key) for key in server.list_keys()} == before
    finally:
        node.shutdown()


# -- PyTorch's c10d state ------------------------------------------------------------------


def _state() -> TorchRendezvousState:
    now = datetime.now(timezone.utc)
    a, b, c = TorchNode("node0", 11, 0), TorchNode("node1", 12, 0), TorchNode("node2", 13, 1)
    return TorchRendezvousState(
        round=4,
        complete=True,
        deadline=now + timedelta(seconds=30),
        participants={a: 0, b: 1},
        wait_list={c},
        redundancy_list=set(),
        last_heartbeats={a: now, b: now - timedelta(seconds=2), c: now},
    )


def test_state_round_trips() -> None:
    state = _state()
    assert decode_torch_state(encode_torch_state(state), "k") == state


def test_encoded_state_names_only_pytorchs_classes_and_datetime() -> None:
    opcodes = list(pickletools.genops(base64.b64decode(encode_torch_state(_state()))))
    named = {
        (opcodes[index - 2][1], opcodes[index - 1][1])
        for index, (op, _, _) in enumerate(opcodes)
        if op.name == "STACK_GLOBAL"
    }
    assert named == {
        (TORCH_MODULE, "_RendezvousState"),
        (TORCH_MODULE, "_NodeDesc"),
        ("datetime", "datetime"),
        ("datetime", "timezone"),
        ("datetime", "timedelta"),
    }
    assert {op.name for op, _, _ in opcodes} & {"GLOBAL", "INST", "OBJ", "PERSID"} == set()


class Payload:
    def __reduce__(self) -> tuple[Callable[..., object], tuple[str]]:
        return (os.system, ("echo unpickled",))


@pytest.mark.parametrize(
    "value",
    [
        pickle.dumps(Payload()),
        pickle.dumps(TorchRendezvousState()),  # our own class: not PyTorch's
        pickle.dumps({"round": 1}),
        pickle.dumps(eval),
        b"\x80\x04not a pickle",
    ],
    ids=["os.system", "our-class", "dict", "builtins.eval", "garbage"],
)
def test_decoder_refuses_anything_but_pytorchs_state(value: bytes) -> None:
    with pytest.raises(RendezvousStateError, match="the key"):
        decode_torch_state(base64.b64encode(value), "the key")


def test_decoder_refuses_what_is_not_base64() -> None:
    with pytest.raises(RendezvousStateError, match="not base64"):
        decode_torch_state(b"{not base64}", "the key")


def test_torch_run_reads_nothing_as_none_and_the_placeholder_as_empty(server: TCPStore) -> None:
    run = TorchC10dRun(TCPStore("127.0.0.1", server.port, timeout=5), RUN)
    assert run.read() is None
    assert not server.check([torch_state_key(RUN)])  # reading created nothing
    server.set(torch_state_key(RUN), TORCH_VACANT)
    found = run.read()
    assert found is not None
    assert found[0] == TorchRendezvousState()


def test_torch_run_status_and_close(server: TCPStore) -> None:
    server.set(torch_state_key(RUN), encode_torch_state(_state()))
    assert server.check([torch_state_key(RUN)])  # stored before another connection reads
    run = TorchC10dRun(TCPStore("127.0.0.1", server.port, timeout=5), RUN)
    found = run.read()
    assert found is not None
    status = run.status(found[0])
    assert (status.backend, status.round, status.complete) == ("c10d", 4, True)
    assert not status.closed
    assert [(n.node, n.rank) for n in status.participants] == [("node0_11_0", 0), ("node1_12_0", 1)]
    assert [n.node for n in status.wait_list] == ["node2_13_1"]
    ages = [n.heartbeat_age for n in status.participants]
    assert ages[0] is not None
    assert ages[1] is not None
    assert ages[1] > ages[0]
    closed = run.close(timeout=5)
    assert closed.closed
    stored = decode_torch_state(server.get(torch_state_key(RUN)), "k")
    assert stored == closed
    assert run.close(timeout=5).closed  # closing a closed run is fine


def test_join_timeout_says_timed_out(server: TCPStore) -> None:
    # Users grep for it, as in PyTorch's messages.
    store = TCPStore("127.0.0.1", server.port, timeout=10)
    handler = DynamicRendezvousHandler.from_backend(
        RUN,
        store,
        InMemoryBackend(),
        2,
        2,
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(join=0.5, last_call=0.1, close=1),
        keep_alive_interval=0.2,
    )
    with pytest.raises(RendezvousError, match=r"timed out|timeout"):
        handler.next_rendezvous()
    handler.shutdown()
