"""Issue 15's PyTorch differences, each checked against real PyTorch 2.13 doing the same thing.

Torch stores with a server run in child processes (PyTorch's C++ store holds
the GIL); everything else runs here, side by side with ours.
"""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
import sys
import tempfile
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from interop_support import OurServer, child_env
from torch.distributed.elastic.rendezvous import RendezvousConnectionError as TorchConnectionError
from torch.distributed.elastic.rendezvous import RendezvousHandlerRegistry as TorchRegistry
from torch.distributed.elastic.rendezvous import RendezvousParameters as TorchParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc, _RendezvousState

import tp_store
from tp_rdzv_api import RendezvousConnectionError, RendezvousParameters
from tp_rdzv_api.registry import RendezvousHandlerRegistry
from tp_rdzv_dynamic.factory import create_store
from tp_rdzv_dynamic.torch_compat.torch_state import (
    TorchNode,
    TorchRendezvousState,
    decode_torch_state,
    encode_torch_state,
)

pytestmark = pytest.mark.interop


# -- PyTorch's c10d state: their pickle read by us, ours loaded by them -------------------


def _torch_state() -> _RendezvousState:
    now = datetime.now(timezone.utc)
    a, b, c = _NodeDesc("node0", 11, 0), _NodeDesc("node1", 12, 0), _NodeDesc("node2", 13, 1)
    state = _RendezvousState()
    state.round = 2
    state.complete = True
    state.deadline = now + timedelta(seconds=5)
    state.participants = {a: 0, b: 1}
    state.wait_list = {c}
    state.redundancy_list = {a}
    state.last_heartbeats = {a: now, b: now, c: now - timedelta(seconds=3)}
    return state


def _same(ours: TorchRendezvousState, theirs: _RendezvousState) -> None:
    def node(n: _NodeDesc) -> TorchNode:
        return TorchNode(n.addr, n.pid, n.local_id)

    assert (ours.round, ours.complete, ours.closed, ours.deadline) == (
        theirs.round,
        theirs.complete,
        theirs.closed,
        theirs.deadline,
    )
    assert ours.participants == {node(n): rank for n, rank in theirs.participants.items()}
    assert ours.wait_list == {node(n) for n in theirs.wait_list}
    assert ours.redundancy_list == {node(n) for n in theirs.redundancy_list}
    assert ours.last_heartbeats == {node(n): t for n, t in theirs.last_heartbeats.items()}


def test_we_read_the_state_pytorch_writes() -> None:
    theirs = _torch_state()
    ours = decode_torch_state(base64.b64encode(pickle.dumps(theirs)), "k")
    _same(ours, theirs)


def test_pytorch_loads_the_state_we_write_as_its_own() -> None:
    ours = decode_torch_state(base64.b64encode(pickle.dumps(_torch_state())), "k")
    ours.closed = True
    theirs = pickle.loads(base64.b64decode(encode_torch_state(ours)))
    assert type(theirs) is _RendezvousState
    assert all(type(n) is _NodeDesc for n in theirs.participants)
    assert theirs.closed
    _same(ours, theirs)


# -- item 2: partial Python stores and what PrefixStore passes ------------------------------


def _recording(base: type) -> Any:
    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.data: dict[Any, bytes] = {}
            self.calls: list[tuple[str, Any, Any]] = []

        def set(self, key: Any, value: Any) -> None:
            self.calls.append(("set", key, value))
            self.data[key] = value

        def get(self, key: Any) -> bytes:
            self.calls.append(("get", key, None))
            return self.data[key]

    return Recording()


@pytest.mark.parametrize(
    ("base", "prefix_store"),
    [(dist.Store, dist.PrefixStore), (tp_store.Store, tp_store.PrefixStore)],
    ids=["torch", "ours"],
)
def test_partial_store_behaves_as_pytorchs(base: type, prefix_store: type) -> None:
    store = _recording(base)
    assert store.has_extended_api() is False
    with pytest.raises(RuntimeError):
        store.add("k", 1)
    prefixed = prefix_store("p", store)
    prefixed.set("foo", "bar")
    assert prefixed.get("foo") == b"bar"
    assert store.calls == [("set", "p/foo", b"bar"), ("get", "p/foo", None)]
    store.multi_set(["a"], [b"1"])
    assert store.multi_get(["a"]) == [b"1"]


@pytest.mark.parametrize("prefix_store", [dist.PrefixStore, tp_store.PrefixStore])
def test_prefix_store_over_none_is_a_value_error(prefix_store: type) -> None:
    with pytest.raises(ValueError, match="cannot be None"):
        prefix_store("p", None)


# -- items 3 and 9: libuvBackend, and a master under the elastic agent ------------------------

_AGENT_PROBE = """
import json, os, sys
from datetime import timedelta
port = int(sys.argv[1])
if sys.argv[2] == "torch":
    from torch.distributed import TCPStore
else:
    from tp_store import TCPStore
outcomes = {}
for flag, master_port in [("True", port), ("1", port), ("False", port), ("True", port + 1)]:
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = flag
    os.environ["MASTER_PORT"] = str(master_port)
    try:
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=5))
        store.set(f"{flag}-{master_port}", "1")
        outcomes[f"{flag} {master_port == port}"] = "client of the agent's store"
    except Exception as exc:
        bind = "use" in str(exc)
        outcomes[f"{flag} {master_port == port}"] = "cannot bind" if bind else repr(exc)
os.environ.pop("TORCHELASTIC_USE_AGENT_STORE")
for use_libuv in (True, False):
    client = TCPStore("127.0.0.1", port, use_libuv=use_libuv, timeout=timedelta(seconds=5))
    outcomes[f"libuv {use_libuv}"] = client.libuvBackend
print(json.dumps(outcomes))
"""


def test_master_under_the_agent_and_libuv_backend_as_pytorch(our_server: OurServer) -> None:
    answers = {}
    for side in ("torch", "ours"):
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_AGENT_PROBE), str(our_server.port), side],
            capture_output=True,
            text=True,
            timeout=120,
            env=child_env(),
            check=False,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        answers[side] = json.loads(result.stdout)
    assert answers["ours"] == answers["torch"]
    assert answers["ours"]["True True"] == "client of the agent's store"
    assert answers["ours"]["False True"] == "cannot bind"


# -- items 4, 5, 6 and 11: the file store of a c10d rendezvous ---------------------------------


def test_file_store_without_a_path_as_pytorch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _, theirs = create_backend(TorchParameters("c10d", "", "run", 1, 1, store_type="file"))
    ours = create_store(RendezvousParameters("c10d", "", "run", store_type="file"))
    assert isinstance(ours, tp_store.FileStore)
    assert Path(theirs.path).parent == Path(ours.path).parent == tmp_path
    assert ours.timeout == theirs.timeout == timedelta(seconds=300)
    # Ours and PyTorch's FileStore share the format: one can read the other's file.
    ours.set("k", "v")
    assert dist.FileStore(ours.path, -1).get("k") == b"v"


def test_file_store_that_cannot_open_as_pytorch(tmp_path: Path) -> None:
    # A directory. (A missing directory too, but PyTorch retries that for 300 s.)
    path = str(tmp_path)
    with pytest.raises(TorchConnectionError):
        create_backend(TorchParameters("c10d", path, "run", 1, 1, store_type="file"))
    with pytest.raises(RendezvousConnectionError):
        create_store(RendezvousParameters("c10d", path, "run", store_type="file"))


# -- items 8, 10 and 11: parameters and the registry -------------------------------------------


@pytest.mark.parametrize("parameters", [TorchParameters, RendezvousParameters])
def test_missing_backend_is_a_value_error(parameters: type) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        parameters(None, "h:1", "run", 1, 1)


class _Plugin:
    def create(self, params: Any) -> Any:
        raise AssertionError("not called")


@pytest.mark.parametrize("registry", [TorchRegistry, RendezvousHandlerRegistry])
def test_registry_as_pytorchs(registry: Any) -> None:
    instance = registry() if registry is TorchRegistry else registry(None)
    plugin = _Plugin()
    instance.register("mine", plugin.create)
    instance.register("mine", plugin.create)  # the same bound method: no error
    parameters = TorchParameters if registry is TorchRegistry else RendezvousParameters
    with pytest.raises(ValueError, match="not registered"):
        instance.create_handler(parameters("nope", "h:1", "run", 1, 1))
