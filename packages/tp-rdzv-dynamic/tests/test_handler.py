"""The handler in one process: nodes as threads on a real TCPStore server on loopback."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

import pytest
from handler_threads import RUN, rendezvous_all, stop_handler, wait_until

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousExhaustedError,
    RendezvousInfo,
    RendezvousStateError,
    RendezvousTimeout,
)
from tp_rdzv_dynamic import (
    DynamicRendezvousHandler,
    P10dRendezvousBackend,
    RendezvousSettings,
    TpRendezvousBackend,
    _NodeDesc,
    _RendezvousStateHolder,
)
from tp_rdzv_dynamic.documents.bootstrap_address import decode_bootstrap_address
from tp_rdzv_dynamic.documents.codecs import decode_state, encode_message
from tp_rdzv_dynamic.model.decisions import Join
from tp_store import PrefixStore, StoreError, TCPStore


def test_three_nodes_agree(make_node, server):
    handlers = [make_node(3, 3) for _ in range(3)]
    infos = rendezvous_all(handlers)
    assert sorted(info.rank for info in infos) == [0, 1, 2]
    assert {info.world_size for info in infos} == {3}
    lists = {tuple(str(p) for p in info.participants) for info in infos}
    assert len(lists) == 1
    for handler, info in zip(handlers, infos, strict=True):
        assert info.participants[info.rank] == handler.node
        assert isinstance(info.store, PrefixStore)
    # One bootstrap store for the round, not the rendezvous store.
    (bootstrap,) = {info.bootstrap_store_info for info in infos}
    assert bootstrap.master_addr == "127.0.0.1"
    assert bootstrap.port != server.port


def test_every_round_bootstraps_on_a_fresh_store(make_node, server):
    """What a restarted worker of round 2 finds: none of round 1's keys (gloo's, say)."""
    handlers = [make_node(2, 2) for _ in range(2)]
    first = rendezvous_all(handlers)
    (old,) = {info.bootstrap_store_info for info in first}
    worker = TCPStore(old.master_addr, old.port, timeout=5)
    worker.set("default_pg/0//cpu//0/0", "round 1's address")
    assert all(handler.use_agent_store for handler in handlers)

    second = rendezvous_all(handlers)
    (new,) = {info.bootstrap_store_info for info in second}
    assert new != old
    fresh = TCPStore(new.master_addr, new.port, timeout=5)
    assert not fresh.check(["default_pg/0//cpu//0/0"])
    fresh.close()
    # The server of round 1 is gone: it is shut down when its host joins again.
    with pytest.raises(StoreError):
        worker.get("default_pg/0//cpu//0/0")
    worker.close()
    with pytest.raises(StoreError):
        TCPStore(old.master_addr, old.port, timeout=1)

    # The steward, a participant, hosts it: its shutdown closes it.
    (host,) = [handler for handler in handlers if handler._office.running]
    assert host.shutdown()
    with pytest.raises(StoreError):
        TCPStore(new.master_addr, new.port, timeout=1)


def test_a_local_addr_it_cannot_listen_on_is_an_error_naming_it(make_node):
    # A typo must not open an unauthenticated store to the whole network.
    handler = make_node(1, 1, local_addr="node0.invalid")
    with pytest.raises(RendezvousConnectionError, match=r"cannot listen on 'node0\.invalid'"):
        handler.next_rendezvous()


def test_a_rank_0_that_cannot_host_lets_the_others_go_on(make_node):
    # "0.invalid" sorts first: it gets rank 0 and cannot listen on its address. It
    # is the steward too (else the steward would host the store, not rank 0). It
    # fails, and marks the round stale: the other node joins the next round, which it
    # completes alone, instead of waiting for an address that never comes.
    lost = make_node(1, 2, local_addr="0.invalid", join=30, last_call=2)
    survivor = make_node(1, 2, local_addr="127.0.0.1", join=30, last_call=2)
    with ThreadPoolExecutor(2) as pool:
        failed = pool.submit(lost.next_rendezvous)
        wait_until(lambda: lost._office.running, 30)
        info = pool.submit(survivor.next_rendezvous)
        with pytest.raises(RendezvousConnectionError, match=r"cannot listen on '0\.invalid'"):
            failed.result(timeout=60)
        second = info.result(timeout=60)
    assert (second.rank, second.world_size) == (0, 1)
    assert second.participants == [survivor.node]


def test_the_steward_hosts_the_workers_store_named_in_every_answer(make_node, server):
    handlers = [make_node(3, 3) for _ in range(3)]
    before = server.server_stats()["ops"]
    infos = rendezvous_all(handlers)
    after = server.server_stats()["ops"]
    (steward,) = [handler for handler in handlers if handler._office.running]
    (bootstrap,) = {info.bootstrap_store_info for info in infos}
    assert bootstrap.master_addr == steward.node.addr
    assert steward._bootstrap._round == 0  # its child serves round 0's workers
    # Written once, where a node of another version (or rank 0) would look for it.
    published = server.get(f"tp_rdzv/{RUN}/bootstrap/0")
    assert decode_bootstrap_address(published, "bootstrap/0") == bootstrap
    # Nobody waited for the address: each node's one wait was for its answer,
    # which carried it (and the steward published it with one compare-and-set).
    assert after["wait_any"] - before.get("wait_any", 0) == len(handlers)
    worker = TCPStore(bootstrap.master_addr, bootstrap.port, timeout=5)
    worker.set("k", "v")
    worker.close()


def test_a_steward_that_is_a_spare_leaves_the_workers_store_to_rank_0(make_node):
    # Loopback addresses of their own: who hosts the store shows in its address.
    first, second = (make_node(2, 2, local_addr=f"127.0.0.{i}") for i in (2, 3))
    rendezvous_all([first, second])
    (steward,) = [handler for handler in (first, second) if handler._office.running]
    steward._office.stop()  # it hands the lease back and stays a member
    spare = make_node(2, 2, local_addr="127.0.0.4")
    with ThreadPoolExecutor(1) as pool:
        pool.submit(spare.next_rendezvous)  # beyond max_nodes: it waits, and takes the lease
        wait_until(lambda: spare._office.running, 30)
        wait_until(lambda: [n.node for n in first.status().redundancy_list] == [str(spare.node)])
        infos = rendezvous_all([first, second])  # the survivors are seated before the spare
        (bootstrap,) = {info.bootstrap_store_info for info in infos}
        assert {info.rank for info in infos} == {0, 1}
        assert bootstrap.master_addr == "127.0.0.2"  # rank 0's, not the steward's
        assert spare._office.running
        assert spare._bootstrap._round is None  # it hosts nothing
        TCPStore(bootstrap.master_addr, bootstrap.port, timeout=5).close()
        stop_handler(spare)  # ends its wait


def test_a_rank_0_dead_before_publishing_the_bootstrap_store_fails_nobody(
    make_node, server, caplog
):
    # A steward that cannot host the workers' store (it cannot listen on its
    # address) leaves it to rank 0. A join nobody heartbeats for, under an address
    # that sorts first, gets rank 0 of the round, never publishes the store, and is
    # found dead. The others must not fail with it (an agent gives up on any
    # error): they join the next round.
    ghost = _NodeDesc("0.ghost", 1, 0)
    server.queue_push(f"tp_rdzv/{RUN}/mailbox", encode_message(Join(ghost, None, 0)))
    steward = make_node(2, 3, join=30, local_addr="zz.invalid")
    other = make_node(2, 3, join=30)
    with ThreadPoolExecutor(2) as pool:
        steward_round = pool.submit(steward.next_rendezvous)
        wait_until(lambda: steward._office.running, 30)
        rounds = [steward_round, pool.submit(other.next_rendezvous)]
        infos = [future.result(timeout=60) for future in rounds]
    assert sorted(info.rank for info in infos) == [0, 1]
    assert all(ghost not in info.participants for info in infos)
    (bootstrap,) = {info.bootstrap_store_info for info in infos}
    assert bootstrap.master_addr == other.node.addr  # rank 0 of the next round hosts it
    TCPStore(bootstrap.master_addr, bootstrap.port, timeout=5).close()
    abandoned = [r for r in caplog.records if getattr(r, "action", None) == "round_abandoned"]
    assert len(abandoned) == 2, "the ghost did not get rank 0 of a round"
    not_hosted = [r for r in caplog.records if getattr(r, "action", None) == "bootstrap_not_hosted"]
    assert "zz.invalid" in not_hosted[0].getMessage()


def test_round_stores_are_separate_and_shared(make_node):
    handlers = [make_node(2, 2) for _ in range(2)]
    first = rendezvous_all(handlers)
    first[0].store.set("k", "round0")
    assert first[1].store.get("k") == b"round0"
    second = rendezvous_all(handlers)
    assert not second[0].store.check(["k"])
    assert sorted(info.rank for info in second) == [0, 1]


def test_late_joiner_is_counted_then_joins_the_next_round(make_node):
    handlers = [make_node(2, 3) for _ in range(2)]
    rendezvous_all(handlers)
    late = make_node(2, 3)
    with ThreadPoolExecutor(1) as pool:
        pending: Future[RendezvousInfo] = pool.submit(late.next_rendezvous)
        wait_until(lambda: all(h.num_nodes_waiting() == 1 for h in handlers))
        assert not pending.done()
        infos = rendezvous_all(handlers)
        late_info = pending.result(timeout=10)
    assert late_info.world_size == 3
    assert sorted(info.rank for info in [*infos, late_info]) == [0, 1, 2]
    assert handlers[0].num_nodes_waiting() == 0


def test_max_completes_without_waiting_for_the_last_call(make_node):
    handlers = [make_node(1, 3, last_call=60) for _ in range(3)]
    started = time.monotonic()
    rendezvous_all(handlers)
    assert time.monotonic() - started < 30  # the 60 s last call never ran


def test_closing_wakes_waiters_and_rejects_joiners(make_node):
    a, b = make_node(3, 3), make_node(3, 3)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(a.next_rendezvous)
        wait_until(lambda: a._office.running)  # a has joined: it leads the empty run
        b.set_closed()
        with pytest.raises(RendezvousClosedError):
            waiting.result(timeout=10)
    assert a.is_closed()
    assert b.is_closed()
    with pytest.raises(RendezvousClosedError):
        make_node(3, 3).next_rendezvous()


def test_join_timeout_rolls_back(make_node):
    lonely = make_node(2, 2, join=1)
    with pytest.raises(RendezvousExhaustedError) as caught:
        lonely.next_rendezvous()
    assert (caught.value.min_nodes, caught.value.joined) == (2, 1)
    raw, _ = lonely._holder.backend.get_state()
    state = decode_state(raw, "test")
    assert lonely.node not in set(state.members())
    # The steward lease was handed back: two new nodes rendezvous at once.
    infos = rendezvous_all([make_node(2, 2), make_node(2, 2)])
    assert sorted(info.rank for info in infos) == [0, 1]
    assert lonely.node not in infos[0].participants


def test_corrupt_state_names_the_key(make_node, server):
    handler = make_node(1, 1)
    server.set("tp_rdzv/job/state", b"\x80\x04not json")
    assert server.check(["tp_rdzv/job/state"])  # stored before the node's own connection reads
    with pytest.raises(RendezvousStateError, match="tp_rdzv/job/state"):
        handler.next_rendezvous()
    with pytest.raises(RendezvousStateError, match="tp_rdzv/job/state"):
        handler.set_closed()


def test_p10d_backend_rendezvous(make_node):
    handlers = [make_node(2, 2, backend=P10dRendezvousBackend) for _ in range(2)]
    infos = rendezvous_all(handlers)
    assert sorted(info.rank for info in infos) == [0, 1]
    assert handlers[0].get_backend() == "p10d"


# -- construction -------------------------------------------------------------------------


def test_documented_keyword_form(server):
    store = TCPStore("127.0.0.1", server.port, timeout=5)
    settings = RendezvousSettings(run_id="kw", min_nodes=1, max_nodes=1)
    handler = DynamicRendezvousHandler(
        backend=TpRendezvousBackend(store, "kw"),
        settings=settings,
        local_addr="127.0.0.1",
        node_rank=0,
        store=store,
    )
    assert (handler.get_backend(), handler.get_run_id()) == ("core", "kw")
    assert handler.use_agent_store
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert handler.shutdown()
    assert handler.is_closed()


def test_pytorch_positional_form(server):
    store = TCPStore("127.0.0.1", server.port, timeout=5)
    settings = RendezvousSettings("pos", 1, 1, RendezvousTimeout(), timedelta(seconds=1), 3)
    holder = _RendezvousStateHolder(TpRendezvousBackend(store, "pos"), "pos")
    node = _NodeDesc("127.0.0.1", 1234, 0)
    handler = DynamicRendezvousHandler(node, settings, "c10d", store, holder)
    assert handler.get_backend() == "c10d"
    assert handler.node == node
    assert handler.next_rendezvous().participants == [node]
    handler.shutdown()


def test_from_backend_takes_the_backend_name(server):
    store = TCPStore("127.0.0.1", server.port, timeout=5)
    handler = DynamicRendezvousHandler.from_backend(
        "fb", store, P10dRendezvousBackend(store, "fb"), 1, 2, keep_alive_interval=2
    )
    assert handler.get_backend() == "p10d"
    assert handler.settings.keep_alive_interval == timedelta(seconds=2)
    assert (handler.settings.min_nodes, handler.settings.max_nodes) == (1, 2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"settings": RendezvousSettings(run_id="")}, ValueError, "run id"),
        ({"backend": None}, TypeError, "RendezvousBackend"),
        ({"settings": "nope"}, TypeError, "RendezvousSettings"),
        ({"node_rank": -1}, ValueError, "node_rank"),
        ({"local_addr": ""}, ValueError, "local_addr"),
        ({"run_id": "other"}, ValueError, "differs"),
        ({"backend_name": ""}, ValueError, "backend_name"),
    ],
)
def test_bad_arguments(server, kwargs, error, match):
    store = TCPStore("127.0.0.1", server.port, timeout=5)
    arguments = {
        "backend": TpRendezvousBackend(store, "bad"),
        "settings": RendezvousSettings(run_id="bad"),
        "store": store,
        **kwargs,
    }
    with pytest.raises(error, match=match):
        DynamicRendezvousHandler(**arguments)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((), {"min_nodes": 0}, ValueError, "min_nodes"),
        ((), {"min_nodes": 3, "max_nodes": 2}, ValueError, "max_nodes"),
        ((), {"keep_alive_max_attempt": 0}, ValueError, "keep_alive_max_attempt"),
        ((), {"keep_alive_interval": -1}, ValueError, "keep_alive_interval"),
        ((), {"join": 0}, ValueError, "join"),
        ((), {"timeout": RendezvousTimeout(), "join": 5}, TypeError, "not both"),
        (("r", 1, 1, None, None, 3, "extra"), {}, TypeError, "at most 6"),
        ((), {"run_id": 5}, TypeError, "run_id"),
        ((), {"min_nodes": True}, TypeError, "min_nodes"),
    ],
)
def test_bad_settings(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        RendezvousSettings(*args, **kwargs)


def test_settings_forms_agree():
    positional = RendezvousSettings("r", 2, 4, RendezvousTimeout(join=9), timedelta(seconds=2), 5)
    keywords = RendezvousSettings(
        run_id="r",
        min_nodes=2,
        max_nodes=4,
        join=9,
        keep_alive_interval=2,
        keep_alive_max_attempt=5,
    )
    assert repr(positional) == repr(keywords)
    assert keywords.liveness_bound == timedelta(seconds=10)
    assert positional.stable_ranks is False
    stable = positional.with_stable_ranks()
    assert (stable.stable_ranks, positional.stable_ranks) == (True, False)
    assert repr(stable) == repr(positional).replace("stable_ranks=False", "stable_ranks=True")
    assert stable.with_stable_ranks(False).stable_ranks is False
    with pytest.raises(TypeError, match="stable_ranks must be a bool"):
        positional.with_stable_ranks("yes")  # type: ignore[arg-type]


def test_many_threads_one_round(make_node):
    handlers = [make_node(50, 50) for _ in range(50)]
    infos = rendezvous_all(handlers)
    assert sorted(info.rank for info in infos) == list(range(50))
    participants = infos[0].participants
    assert participants == sorted(participants, key=lambda n: n.local_id)
    assert all(info.participants == participants for info in infos)


def test_threads_do_not_leak_after_shutdown(make_node):
    before = threading.active_count()
    handlers = [make_node(2, 2) for _ in range(2)]
    rendezvous_all(handlers)
    for handler in handlers:
        handler.shutdown()
    wait_until(lambda: threading.active_count() <= before + 1)


# -- for agents and operators: status() and wait_for_change() -------------------


def test_status_before_any_round(make_node):
    status = make_node(2, 2).status()
    assert (status.round, status.complete, status.closed) == (0, False, False)
    assert status.participants == status.wait_list == status.redundancy_list == ()
    assert status.steward is None


def test_status_lists_the_round_in_rank_order_with_presence(make_node):
    handlers = [make_node(3, 3, interval=0.2) for _ in range(3)]
    infos = rendezvous_all(handlers)
    # The steward reports whom it watches through sessions with the membership.
    wait_until(lambda: all(n.present for n in handlers[0].status().participants))
    status = handlers[0].status()
    assert status.complete
    assert not status.closed
    by_rank = sorted(infos, key=lambda info: info.rank)
    assert [n.node for n in status.participants] == [str(p) for p in by_rank[0].participants]
    assert [n.rank for n in status.participants] == [0, 1, 2]
    assert status.steward in {str(h.node) for h in handlers}
    assert [n.heartbeat_age for n in status.participants] == [None, None, None]
    document = status.to_dict()
    assert document["participants"][0]["rank"] == 0
    assert document["run_id"] == RUN


def test_status_names_a_corrupt_liveness_report(make_node, server):
    handler = make_node(1, 1)
    server.set(f"tp_rdzv/{RUN}/liveness", b"\x00 not json")
    assert server.check([f"tp_rdzv/{RUN}/liveness"])  # stored before the node reads
    with pytest.raises(RendezvousStateError, match="liveness"):
        handler.status()


def test_wait_for_change_sees_a_late_joiner_and_the_closing(make_node):
    handlers = [make_node(2, 3) for _ in range(2)]
    rendezvous_all(handlers)
    assert not handlers[0].wait_for_change(0.2)
    late = make_node(2, 3)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(late.next_rendezvous)
        assert handlers[0].wait_for_change(10)
        infos = rendezvous_all(handlers)
        assert pending.result(timeout=10).world_size == 3
    assert {info.world_size for info in infos} == {3}
    assert not handlers[1].wait_for_change(0.2)  # the new round is current
    handlers[0].set_closed()
    assert handlers[1].wait_for_change(10)


def test_wait_for_change_sees_a_participant_leave(make_node):
    handlers = [make_node(2, 3, last_call=0.1) for _ in range(3)]
    rendezvous_all(handlers)
    with ThreadPoolExecutor(2) as pool:
        # Two of them ask for a new round: the one left in the old round is told.
        pending = [pool.submit(h.next_rendezvous) for h in handlers[1:]]
        assert handlers[0].wait_for_change(10)
        mine = handlers[0].next_rendezvous()
        infos = [mine, *[f.result(timeout=10) for f in pending]]
    assert sorted(info.rank for info in infos) == [0, 1, 2]


def test_wait_for_change_before_the_first_round_is_true(make_node):
    assert make_node(1, 1).wait_for_change(0.1)
