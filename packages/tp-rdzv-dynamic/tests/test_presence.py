"""Presence through store sessions, with nodes as threads on a real TCPStore server.

The server offers store sessions, so every node is present through one and the
steward holds its lease through one. Stores without sessions (a file here)
keep heartbeat counters. The multi-process tests (killed and paused processes)
are in ``test_dynamic_multiprocess.py``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from handler_threads import RUN, close_presence_connection, rendezvous_all, wait_until

from tp_rdzv_api import RendezvousClosedError, RendezvousTimeout
from tp_rdzv_dynamic import DynamicRendezvousHandler, TpRendezvousBackend
from tp_rdzv_dynamic.documents.codecs import Lease, encode_message
from tp_rdzv_dynamic.documents.layout import RunLayout
from tp_rdzv_dynamic.model.gone import Gone
from tp_rdzv_dynamic.steward.tenure import WILLS_PER_SESSION
from tp_store import FileStore, HashStore, Store

KEYS = RunLayout(RUN)


def records(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == action]


def steward_of(handlers: list[DynamicRendezvousHandler]) -> DynamicRendezvousHandler:
    (steward,) = [h for h in handlers if h._office.running]
    return steward


@contextmanager
def steward_ended_while_a_joiner_waits(
    steward: DynamicRendezvousHandler,
    joiner: DynamicRendezvousHandler,
    observer: DynamicRendezvousHandler,
    store: Store,
) -> Iterator[Lease]:
    """``steward`` and ``joiner`` wait for a round of three, under ``steward``'s lease
    held through a session, which the store then ends; yields the lease as it was.

    After the block ``observer`` closes the rendezvous, the outcome both wait for.
    """
    with ThreadPoolExecutor(2) as pool:
        waits = [pool.submit(steward.next_rendezvous)]
        wait_until(lambda: Lease.parse(store.get(KEYS.lease)).session_held, seconds=30)
        # The joiner reads the lease held through the steward's session, and waits
        # for its vacancy too.
        waits.append(pool.submit(joiner.next_rendezvous))
        # Read on an idle node's connection (a waiting node's is busy with its wait).
        wait_until(lambda: observer._board.pending() == 2, seconds=30)
        before = Lease.parse(store.get(KEYS.lease))
        # The store ends the steward's session: the lease goes with it.
        steward._office._steward._tenure.close()  # type: ignore[union-attr]
        yield before
        observer.set_closed()
        for wait in waits:
            with pytest.raises(RendezvousClosedError):
                wait.result(60)


def test_nodes_are_present_through_sessions_and_write_no_counters(make_node, server):
    handlers = [make_node(3, 3, interval=0.2) for _ in range(3)]
    rendezvous_all(handlers)
    for handler in handlers:
        assert server.check([KEYS.presence(handler.node.key)])
        # No heartbeat counter is ever written: nothing per node per interval.
        assert not server.check([KEYS.heartbeat(handler.node.key)])
    wait_until(lambda: all(n.present for n in handlers[0].status().participants))
    status = handlers[0].status()
    assert [n.heartbeat_age for n in status.participants] == [None, None, None]
    assert Lease.parse(server.get(KEYS.lease)).session_held


def test_each_node_is_present_on_its_own_connection_and_opens_no_other(make_node, server):
    handlers = [make_node(8, 8, interval=0.2) for _ in range(8)]  # each connected once
    before = server.server_stats()
    rendezvous_all(handlers)
    after = server.server_stats()
    # A session per node, on the node's connection, and the steward's for its lease:
    # only the steward opens connections (its board's, its state's and its session's).
    assert after["sessions_opened"] - before.get("sessions_opened", 0) == 8 + 1
    assert after["connections_accepted"] - before["connections_accepted"] == 3
    # One leaves: its key goes, the others stay present.
    leaver, *stayers = handlers
    leaver._presence.close()
    assert not server.check([KEYS.presence(leaver.node.key)])
    assert server.check([KEYS.presence(handler.node.key) for handler in stayers])
    wait_until(lambda: len(stayers[0].status().participants) == 7)


def test_a_node_waiting_many_session_timeouts_for_its_round_stays_present(
    make_node, server, caplog
):
    """Its thread waits on the connection that holds its session: the wait, cut
    into slices, keeps the session alive (a stopped process's would not)."""
    caplog.set_level(logging.INFO)
    waiting = make_node(2, 2, interval=0.5)  # a session ends after 1 s of silence
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(waiting.next_rendezvous)
        wait_until(lambda: server.check([KEYS.presence(waiting.node.key)]))
        started = server.server_stats()["uptime_seconds"]
        wait_until(lambda: server.server_stats()["uptime_seconds"] > started + 5.0, seconds=30)
        assert not pending.done()
        assert server.server_stats().get("sessions_ended_expired", 0) == 0
        assert waiting._presence.renewals == 0
        latecomer = make_node(2, 2, interval=0.5)
        assert latecomer.next_rendezvous().world_size == 2
        assert pending.result(timeout=30).world_size == 2
    assert not records(caplog, "node_gone")
    assert not records(caplog, "presence_lost")


def test_presence_outlives_many_session_timeouts_while_the_job_trains(make_node, server):
    handler = make_node(1, 1, interval=0.05)  # a session ends after 0.1 s of silence
    handler.next_rendezvous()
    before = server.server_stats()
    # The pings come from the process's scheduler; each resets the silence timer.
    wait_until(lambda: server.server_stats()["uptime_seconds"] > before["uptime_seconds"] + 1.0)
    assert server.check([KEYS.presence(handler.node.key)])
    assert handler._presence.renewals == 0
    assert server.server_stats().get("sessions_ended_expired", 0) == 0


def test_a_node_whose_session_ends_is_removed_and_the_round_goes_stale(make_node, caplog):
    caplog.set_level(logging.INFO)
    handlers = [make_node(2, 3, interval=0.2) for _ in range(3)]
    rendezvous_all(handlers)
    victim = next(h for h in handlers if not h._office.running)
    survivors = [h for h in handlers if h is not victim]
    victim._presence.close()  # what the store does when its process dies
    assert survivors[0].wait_for_change(10)
    wait_until(lambda: str(victim.node) not in {n.node for n in survivors[0].status().participants})
    assert [r.node for r in records(caplog, "node_gone")] == [str(victim.node)]  # type: ignore[attr-defined]
    assert not records(caplog, "node_dead")
    infos = rendezvous_all(survivors)
    assert {info.world_size for info in infos} == {2}


@pytest.mark.parametrize("victim_is_steward", [False, True], ids=["member", "steward"])
def test_a_node_whose_connection_the_store_closed_while_idle_joins_the_next_round(
    make_node, server, victim_is_steward
):
    # Intervals of a minute: no ping finds the session gone before the agent asks.
    handlers = [make_node(2, 2, interval=60, join=30) for _ in range(2)]
    rendezvous_all(handlers)
    victim = next(h for h in handlers if h._office.running == victim_is_steward)
    # The store closes a connection with its session when the session expires:
    # the node's process was frozen past the liveness bound between rounds.
    close_presence_connection(server, victim)
    # Its first request finds the connection closed: it connects again, is present
    # again, and posts its join.
    infos = rendezvous_all(handlers)
    assert {info.world_size for info in infos} == {2}
    assert sorted(info.rank for info in infos) == [0, 1]
    assert victim._presence.present
    assert victim._presence.renewals == 1


def test_an_agents_polls_survive_the_store_closing_the_nodes_connection(make_node, server):
    handlers = [make_node(2, 2, interval=60, join=30) for _ in range(2)]
    rendezvous_all(handlers)
    member = next(h for h in handlers if not h._office.running)
    # An agent polls these while its workers run; each finds the connection
    # closed once, and answers from a new one instead of failing the agent.
    close_presence_connection(server, member)
    assert member.num_nodes_waiting() == 0
    close_presence_connection(server, member)
    assert not member.is_closed()
    close_presence_connection(server, member)
    status = member.status()
    assert status.exists
    assert status.round == 0
    assert member._presence.renewals == 3
    infos = rendezvous_all(handlers)
    assert {info.world_size for info in infos} == {2}
    # And at the end of the job, its shutdown closes the rendezvous.
    close_presence_connection(server, member)
    assert member.shutdown()
    assert handlers[0].is_closed()


def test_the_rounds_lists_are_read_after_the_store_closed_the_nodes_connection(make_node, server):
    handlers = [make_node(2, 2, interval=60, join=30) for _ in range(2)]
    infos = rendezvous_all(handlers)
    member, info = next(
        (h, i) for h, i in zip(handlers, infos, strict=True) if not h._office.running
    )
    # The answer carried all the round needs: the node's first request after it
    # (the lists, read when asked for) may find its connection closed.
    close_presence_connection(server, member)
    assert sorted(map(str, info.participants)) == sorted(str(h.node) for h in handlers)
    assert member._presence.renewals == 1


def test_a_departure_of_an_older_session_is_ignored(make_node, server, caplog):
    caplog.set_level(logging.INFO)
    handlers = [make_node(2, 2, interval=0.2) for _ in range(2)]
    rendezvous_all(handlers)
    node = handlers[1].node
    # A late word that an earlier session of this node ended: the node is present
    # through its current session, with another token.
    server.queue_push(KEYS.mailbox, encode_message(Gone(node, "an-earlier-session")))
    wait_until(lambda: records(caplog, "presence_renewed"))
    assert not records(caplog, "node_gone")
    assert str(node) in {n.node for n in handlers[0].status().participants}
    assert not handlers[0].wait_for_change(0.2)


def test_a_dead_stewards_lease_is_vacant_at_once_and_taken_without_a_silence(
    make_node, server, caplog
):
    caplog.set_level(logging.INFO)
    # A liveness bound of two minutes: a takeover that waited for it would not happen here.
    handlers = [make_node(2, 3, interval=60) for _ in range(3)]
    rendezvous_all(handlers)
    steward = steward_of(handlers)
    others = [h for h in handlers if h is not steward]
    before = Lease.parse(server.get(KEYS.lease))
    assert before.session_held
    # The store ends the steward's session (its process died): the lease goes and
    # the session's will marks the round stale.
    assert steward._office._steward is not None
    steward._office._steward._tenure.close()
    steward._presence.close()
    assert others[0].wait_for_change(30)
    infos = rendezvous_all(others)
    assert {info.world_size for info in infos} == {2}
    after = Lease.parse(server.get(KEYS.lease))
    assert after.holder in {h.node.key for h in others}
    assert not records(caplog, "steward_takeover")  # no silence was judged
    # The state's epoch fences the old steward out: the new one is past it.
    state = others[0]._holder.observe()
    assert state is not None
    assert state.epoch > before.epoch


def test_a_joiner_waiting_for_its_round_takes_a_dead_stewards_lease_at_once(make_node, server):
    # Intervals of a minute: a waiting node's first look at the lease is a liveness
    # bound (two minutes) away, so only the steward session's will can wake the
    # waiting nodes in time.
    steward, joiner, observer = [make_node(3, 3, interval=60, join=120) for _ in range(3)]
    with steward_ended_while_a_joiner_waits(steward, joiner, observer, server) as before:
        # The session's will wakes both waiting nodes (the steward's own too: only
        # its session ended here), one of which takes the lease over through its own
        # session.

        def taken_over() -> bool:
            if not server.check([KEYS.lease]):  # vacant: deleted with the session
                return False
            lease = Lease.parse(server.get(KEYS.lease))
            return lease.epoch > before.epoch and lease.session_held

        wait_until(taken_over, seconds=20)
        after = Lease.parse(server.get(KEYS.lease))
        assert after.holder in {steward.node.key, joiner.node.key}


def test_a_waiting_joiner_shows_in_the_state_at_once(make_node):
    handlers = [make_node(2, 3, interval=60) for _ in range(2)]
    rendezvous_all(handlers)
    late = make_node(2, 3, interval=60)
    raised: list[BaseException] = []

    def join() -> None:
        try:
            late.next_rendezvous()
        except RendezvousClosedError as exc:
            raised.append(exc)

    waiting = threading.Thread(target=join, daemon=True)
    waiting.start()
    # Persisted with its batch, not at the steward's next tick (a minute away).
    wait_until(lambda: [n.node for n in handlers[0].status().wait_list] == [str(late.node)])
    assert handlers[0].num_nodes_waiting() == 1
    handlers[0].set_closed()  # the joiner's wait ends (RendezvousClosedError)
    waiting.join(10)
    assert raised


def file_handler(path: Path, interval: float) -> DynamicRendezvousHandler:
    store = FileStore(str(path), timeout=10)
    return DynamicRendezvousHandler.from_backend(
        RUN,
        store,
        TpRendezvousBackend(store, RUN),
        2,
        2,
        local_addr="127.0.0.1",
        timeout=RendezvousTimeout(join=30, last_call=0.3),
        keep_alive_interval=interval,
        keep_alive_max_attempt=2,
    )


class SessionsWithoutWaitAny(HashStore):
    """A user's store with sessions but without ``wait_any`` (as etcd's is today)."""

    wait_any = Store.wait_any

    def clone(self) -> SessionsWithoutWaitAny:
        twin = SessionsWithoutWaitAny(self.timeout)
        twin._data = self._data
        return twin


def test_on_a_store_without_wait_any_waiting_nodes_tick_to_find_a_dead_steward():
    data = SessionsWithoutWaitAny(timedelta(seconds=10))
    handlers = []
    for _ in range(3):
        store = data.clone()
        handlers.append(
            DynamicRendezvousHandler.from_backend(
                RUN,
                store,
                TpRendezvousBackend(store, RUN),
                3,
                3,
                local_addr="127.0.0.1",
                timeout=RendezvousTimeout(join=60, last_call=0.3),
                keep_alive_interval=0.5,
                keep_alive_max_attempt=20,  # a bound of 10 s: only ticks find it sooner
            )
        )
    steward, joiner, observer = handlers
    try:
        with steward_ended_while_a_joiner_waits(steward, joiner, observer, data) as before:
            # The nodes learnt that the store cannot wait for the vacancy: they tick.
            wait_until(
                lambda: (
                    data.check([KEYS.lease])
                    and Lease.parse(data.get(KEYS.lease)).epoch > before.epoch
                ),
                seconds=8,
            )
    finally:
        for handler in handlers:
            handler._office.stop()
            handler._heartbeats.stop()
            handler._presence.close()


def test_without_sessions_nodes_beat_counters_and_the_steward_reports_ages(tmp_path):
    handlers = [file_handler(tmp_path / "store", 0.1) for _ in range(2)]
    try:
        rendezvous_all(handlers)
        assert not handlers[0]._presence.offered
        store = FileStore(str(tmp_path / "store"), timeout=10)
        key = KEYS.heartbeat(handlers[0].node.key)
        first = int(store.get(key))
        wait_until(lambda: int(store.get(key)) >= first + 3, seconds=10)
        wait_until(
            lambda: all(n.heartbeat_age is not None for n in handlers[0].status().participants)
        )
        assert not any(n.present for n in handlers[0].status().participants)
        assert not Lease.parse(store.get(KEYS.lease)).session_held
    finally:
        for handler in handlers:
            handler._office.stop()
            handler._heartbeats.stop()


def test_the_stewards_session_is_replaced_before_its_wills_pile_up(make_node, server):
    handlers = [make_node(2, 2, interval=0.5) for _ in range(2)]
    for _ in range(WILLS_PER_SESSION + 4):
        rendezvous_all(handlers)  # each call after the first opens and completes a round
    tenure = steward_of(handlers)._office._steward._tenure  # type: ignore[union-attr]
    assert 1 <= tenure._wills <= WILLS_PER_SESSION
    assert Lease.parse(server.get(KEYS.lease)).session_held
    # The will of the current session still marks the current round.
    other = next(h for h in handlers if not h._office.running)
    tenure.close()
    assert other.wait_for_change(30)


def test_departures_after_the_closing_leave_the_state_alone(make_node):
    handlers = [make_node(3, 3, interval=0.5) for _ in range(3)]
    rendezvous_all(handlers)
    steward = steward_of(handlers)
    steward.set_closed()
    saved = steward._holder.observe()
    for handler in handlers:
        if handler is not steward:
            handler._presence.close()
    # The steward drains the departures (a wake-up after them shows it) and saves nothing.
    board = steward._board
    board.wake()
    wait_until(lambda: board.store.queue_len(board.keys.mailbox) == 0)
    assert steward._holder.observe() == saved


def test_a_member_whose_departure_was_lost_is_judged_within_an_interval(make_node, server, caplog):
    """A steward that drained a departure and died took it along. Its successor
    finds that member without a presence key: dead once its counter has not
    moved for one interval, not for the whole liveness bound (a minute here)."""
    caplog.set_level(logging.INFO)
    handlers = [make_node(2, 3, interval=0.5, attempts=120) for _ in range(3)]
    rendezvous_all(handlers)
    steward = steward_of(handlers)
    victim, successor = [h for h in handlers if h is not steward]
    steward._office.stop()
    victim._presence.close()
    # The departure, taken as the dead steward would have taken it.
    while server.queue_len(KEYS.mailbox):
        server.queue_pop(KEYS.mailbox)
    successor._office.watch(time.monotonic())
    wait_until(
        lambda: str(victim.node) not in {n.node for n in successor.status().participants},
        seconds=30,
    )
    assert [r.node for r in records(caplog, "node_dead")] == [str(victim.node)]  # type: ignore[attr-defined]
    assert not records(caplog, "node_gone")
