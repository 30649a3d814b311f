"""What a round costs: store operations per node stay constant as the node count grows.

Every node's store is wrapped in a counting ``Store`` that forwards each call
to a real TCPStore client of a real server; nothing is simulated.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import pytest

from tp_rdzv_api import RendezvousTimeout
from tp_rdzv_dynamic import DynamicRendezvousHandler, TpRendezvousBackend
from tp_store import Store, TCPStore

#: Long enough that no periodic tick (heartbeat, lease check, last call) can run in a test.
QUIET = 120.0


def _forward(name: str) -> Callable[..., Any]:
    def call(self: CountingStore, *args: Any, **kwargs: Any) -> Any:
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


class Round(NamedTuple):
    """What one round cost."""

    node_calls: list[Counter[str]]  # the calls of each node's store
    steward_calls: list[Counter[str]]  # those of the stewards' stores
    state_writes: int  # the compare-and-sets of the state key
    elapsed: float  # seconds
    requests: int  # every request the server received in the round (its STATS)


def run_round(size: int) -> Round:
    """One round of ``size`` nodes, on a real server, with real clients."""
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
    requests = -sum(master.server_stats()["ops"].values())
    started = time.monotonic()
    with ThreadPoolExecutor(size) as pool:
        infos = list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
    elapsed = time.monotonic() - started
    requests += sum(master.server_stats()["ops"].values()) - 1  # not this STATS
    assert sorted(info.rank for info in infos) == list(range(size))
    node_calls = [Counter(store.calls) for store in stores]
    steward_calls = [Counter(store.calls) for store in clones]
    state_writes = sum(s.cas_keys["tp_rdzv/scaling/state"] for s in [*stores, *clones])
    for handler in handlers:
        handler._office.stop()
        handler._heartbeats.stop()
    master.close()
    return Round(node_calls, steward_calls, state_writes, elapsed, requests)


@pytest.mark.parametrize("size", [8, 64])
def test_node_operations_do_not_grow_with_the_node_count(size):
    per_node = [sum(calls.values()) for calls in run_round(size).node_calls]
    # Heartbeat, lease read (it carries the round to wait for), mailbox post,
    # wait for the outcome, read its own answer (its rank), the workers'
    # bootstrap store (rank 0 publishes it, the others read it: one request
    # each); and for the nodes that first found the lease vacant, one try at it
    # (whose answer names the winner when another won).
    assert max(per_node) <= 7, per_node


def test_server_requests_per_node_stay_flat():
    # Everything the server was asked in a round, nodes' and stewards', per
    # node: as much at 400 nodes as at 100. Anything quadratic in the node
    # count, or any polling, would grow with it.
    small, large = run_round(100), run_round(400)
    assert large.requests / 400 <= small.requests / 100 * 1.1 + 0.5, (small, large)


@pytest.mark.parametrize("size", [8, 64])
def test_joins_do_not_storm_the_state_key(size):
    # Reading it and taking office, persisting the gathered joins once, the
    # round's completion: a handful, the same for 8 nodes as for 64.
    assert run_round(size).state_writes <= 6


@pytest.mark.parametrize("size", [16, 64])
def test_the_steward_is_linear_in_the_node_count(size):
    steward_ops = sum(sum(calls.values()) for calls in run_round(size).steward_calls)
    # Per batch a wait, the mailbox's length, the pipelined pops, the counters
    # and the receipts. On a loaded machine every message may come in a batch
    # of its own: 5 per node at worst, plus a handful per round. Anything
    # quadratic would be thousands at 64 nodes.
    assert steward_ops <= 5 * size + 24


def test_the_steward_drains_the_mailbox_in_one_call_per_wake_up():
    # One round trip per message made the steward of a 4000-node join storm
    # spend longer than the liveness bound between two beats of its lease:
    # waiters took it over, each takeover made every node post again, and the
    # next steward's drain was as long (steward thrash).
    calls = sum(run_round(400).steward_calls, Counter())
    assert calls["queue_pop"] == 0, calls
    assert 0 < calls["queue_pop_many"] <= calls["wait"], calls


def test_completion_is_event_driven():
    # Every timer is two minutes long: a round of 32 that finished by polling
    # would take one tick at least; woken by the store it takes a moment.
    assert run_round(32).elapsed < QUIET / 4


def test_a_waiting_node_ticks_on_its_own_connection():
    # While a node waits for its round it heartbeats every tick, from its own
    # thread on its own connection: the wait for the outcome is cut into one
    # slice per interval, and the node opens no connection for its ticks (a
    # node costs the server one connection).
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=30)
    clones: list[CountingStore] = []
    stores = [CountingStore(TCPStore("127.0.0.1", master.port, timeout=30), clones)]
    stores.append(CountingStore(TCPStore("127.0.0.1", master.port, timeout=30), clones))
    first, second = (
        DynamicRendezvousHandler.from_backend(
            "ticks",
            store,
            TpRendezvousBackend(store, "ticks"),
            2,
            2,
            local_addr="127.0.0.1",
            timeout=RendezvousTimeout(join=QUIET, last_call=QUIET),
            keep_alive_interval=0.2,
            keep_alive_max_attempt=50,
        )
        for store in stores
    )
    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(first.next_rendezvous)
        beats = f"tp_rdzv/ticks/hb/{first.node.key}"
        deadline = time.monotonic() + 60
        while master.add(beats, 0) < 6:  # the join's beat and five ticks
            assert time.monotonic() < deadline, "the waiting node stopped heartbeating"
            assert not waiting.done(), waiting.result()
            time.sleep(0.05)
        # A wait per slice: the first, and one after each tick.
        assert stores[0].calls["wait_get"] >= 5, stores[0].calls
        # The only clones: the steward's (this node took the vacant lease) board and state.
        assert len(clones) == 2
        joined = [waiting, pool.submit(second.next_rendezvous)]
        assert sorted(future.result(timeout=60).rank for future in joined) == [0, 1]
    for handler in (first, second):
        handler.shutdown()
    master.close()
