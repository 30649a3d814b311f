"""What a round costs: store operations per node stay constant as the node count grows.

Every node's store is wrapped in a counting ``Store`` that forwards each call
to a real TCPStore client of a real server; nothing is simulated.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tp_rdzv_api import RendezvousTimeout
from tp_rdzv_dynamic import DynamicRendezvousHandler, TpRendezvousBackend
from tp_store import Store, TCPStore

#: Long enough that no periodic tick (heartbeat, lease check, last call) can run in a test.
QUIET = 120.0


def _forward(name: str) -> Callable[..., Any]:
    def call(self: CountingStore, *args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else ""
        key = first[0] if isinstance(first, (list, tuple)) and first else first
        # Traffic in the round's own store (the bootstrap address) is the
        # workers' business, not the rendezvous'.
        if "/r0/" not in str(key):
            self.calls[name] += 1
        if name == "compare_set":
            self.cas_keys[args[0]] += 1
        return getattr(self.inner, name)(*args, **kwargs)

    call.__name__ = name
    return call


class CountingStore(Store):
    """A store that counts the calls it forwards; its clones are tracked in ``clones``."""

    def __init__(self, inner: Store, clones: list[CountingStore]) -> None:
        super().__init__(inner.timeout)
        self.inner = inner
        self.calls: Counter[str] = Counter()
        self.cas_keys: Counter[str] = Counter()
        self.clones = clones

    def clone(self) -> CountingStore:
        twin = CountingStore(self.inner.clone(), self.clones)
        self.clones.append(twin)
        return twin

    def close(self) -> None:
        self.inner.close()


for _name in [
    *("set", "get", "add", "compare_set", "wait", "check", "delete_key", "num_keys"),
    *("append", "list_keys", "queue_push", "queue_pop", "queue_pop_many", "queue_len"),
    *("wait_get", "multi_get", "multi_set"),
]:
    setattr(CountingStore, _name, _forward(_name))


def run_round(size: int) -> tuple[list[Counter[str]], list[Counter[str]], int, float]:
    """One round of ``size`` nodes.

    Returns the calls of each node's store, those of the stewards' stores,
    the compare-and-sets of the state key, and the seconds the round took.
    """
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=30)
    clones: list[CountingStore] = []
    stores = [
        CountingStore(TCPStore("127.0.0.1", master.port, timeout=30), clones) for _ in range(size)
    ]
    handlers = [
        DynamicRendezvousHandler.from_backend(
            "scaling",
            store,
            TpRendezvousBackend(store, "scaling"),
            size,
            size,
            local_addr="127.0.0.1",
            timeout=RendezvousTimeout(join=QUIET, last_call=QUIET),
            keep_alive_interval=QUIET,
        )
        for store in stores
    ]
    for store in stores:  # count the rendezvous only, not the backends' creation
        store.calls.clear()
        store.cas_keys.clear()
    started = time.monotonic()
    with ThreadPoolExecutor(size) as pool:
        infos = list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
    elapsed = time.monotonic() - started
    assert sorted(info.rank for info in infos) == list(range(size))
    node_calls = [Counter(store.calls) for store in stores]
    steward_calls = [Counter(store.calls) for store in clones]
    state_writes = sum(s.cas_keys["tp_rdzv/scaling/state"] for s in [*stores, *clones])
    for handler in handlers:
        handler._stop_steward()
        handler._stop_heartbeats()
    master.close()
    return node_calls, steward_calls, state_writes, elapsed


@pytest.mark.parametrize("size", [8, 64])
def test_node_operations_do_not_grow_with_the_node_count(size):
    node_calls, _, _, _ = run_round(size)
    per_node = [sum(calls.values()) for calls in node_calls]
    # Heartbeat, lease read (it carries the round to wait for), mailbox post,
    # wait for the outcome; and for the nodes that first found the lease
    # vacant, one try at it and, when another node won, one more read.
    assert max(per_node) <= 6, node_calls


@pytest.mark.parametrize("size", [8, 64])
def test_joins_do_not_storm_the_state_key(size):
    _, _, state_writes, _ = run_round(size)
    # Reading it and taking office, persisting the gathered joins once, the
    # round's completion: a handful, the same for 8 nodes as for 64.
    assert state_writes <= 6


@pytest.mark.parametrize("size", [16, 64])
def test_the_steward_is_linear_in_the_node_count(size):
    steward_ops = sum(sum(calls.values()) for calls in run_round(size)[1])
    # A pop per message, and per batch a wait, the pop that finds the mailbox
    # empty and the counters. On a loaded machine every message may come in a
    # batch of its own: 4 per node at worst, plus a handful per round. Anything
    # quadratic would be thousands at 64 nodes.
    assert steward_ops <= 4 * size + 24


def test_completion_is_event_driven():
    # Every timer is two minutes long: a round of 32 that finished by polling
    # would take one tick at least; woken by the store it takes a moment.
    *_, elapsed = run_round(32)
    assert elapsed < QUIET / 4
