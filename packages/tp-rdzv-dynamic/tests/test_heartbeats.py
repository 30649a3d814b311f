"""The process's heartbeat scheduler: one thread calling every node's keep-alive."""

from __future__ import annotations

import threading
import time

from tp_rdzv_dynamic.node.heartbeats import HeartbeatScheduler

INTERVAL = 0.2


def test_a_beat_that_ran_long_is_not_called_again_at_once() -> None:
    # A keep-alive reconnecting to a dead store holds the node's connection for
    # the store timeout; called again at once, it would hold it again before the
    # node's own call, waiting for the connection, could take it.
    scheduler = HeartbeatScheduler()
    calls: list[tuple[float, float]] = []
    second = threading.Event()

    def beat() -> None:
        began = time.monotonic()
        if not calls:
            threading.Event().wait(5 * INTERVAL)  # a slow store call
        calls.append((began, time.monotonic()))
        if len(calls) == 2:
            second.set()

    ticket = scheduler.start(beat, INTERVAL, first=0)
    try:
        assert second.wait(30), "the beat was not called again"
    finally:
        scheduler.stop(ticket)
    (_, first_ended), (second_began, _) = calls[:2]
    assert second_began - first_ended >= INTERVAL * 0.99


def test_beats_keep_their_interval_and_none_comes_after_the_stop() -> None:
    scheduler = HeartbeatScheduler()
    calls: list[float] = []
    third = threading.Event()

    def beat() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            third.set()
            scheduler.stop(ticket)  # from within its own beat, as a handler's shutdown may

    begun = time.monotonic()
    ticket = scheduler.start(beat, INTERVAL, first=0)
    assert third.wait(30)
    # Another ticket's later beat runs; this one's never comes again.
    other = threading.Event()
    later = scheduler.start(other.set, INTERVAL, first=2 * INTERVAL)
    assert other.wait(30)
    scheduler.stop(later)
    assert len(calls) == 3
    # On its schedule: the k-th call no earlier than k intervals after the start
    # (a late call does not push the next one back).
    assert all(at >= begun + k * INTERVAL for k, at in enumerate(calls)), (begun, calls)


def test_a_beat_due_before_all_others_is_not_held_back_by_them() -> None:
    # The thread sleeps until the earliest beat; one started later but due
    # sooner must wake it, whatever number of later beats came before it.
    scheduler = HeartbeatScheduler()
    later = [scheduler.start(lambda: None, 600.0, first=300.0) for _ in range(100)]
    asleep, soon = threading.Event(), threading.Event()
    # Once this beat ran, the thread sleeps until the later ones are due.
    tickets = [*later, scheduler.start(asleep.set, 600.0, first=0)]
    try:
        assert asleep.wait(30)
        tickets.append(scheduler.start(soon.set, 600.0, first=0))
        assert soon.wait(30), "the beat due first waited for the later ones"
    finally:
        for ticket in tickets:
            scheduler.stop(ticket)
