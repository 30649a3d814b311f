"""The behaviour of every store offering store sessions (``Store.open_session``), as tests.

Subclass :class:`StoreSessionContract` as ``Test...`` in a test module next
to a ``harness`` fixture yielding a :class:`~tp_store.testing.contract.Harness`
whose store offers sessions (see :mod:`tp_store.testing.contract`).

This module needs ``pytest``: import it from tests only.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from tp_store import (
    SessionExpiredError,
    Store,
    StoreConnectionError,
    StoreSession,
    UnsupportedOperationError,
)
from tp_store.testing.contract import TIMEOUT, Call, Harness

#: A session timeout that never fires by accident during a test.
LONG = 60.0
#: A session timeout meant to fire: short, yet longer than a loaded machine's hiccups
#: between the keep-alives of test_keep_alive_keeps_a_silent_session_open.
EXPIRING = 1.5


def pushed(store: Store, queue: str) -> list[bytes]:
    """Every value in ``queue`` now, oldest first (taking them out)."""
    return store.queue_pop_many(queue, 1000)


class StoreSessionContract:
    """The store-session contract tests; subclass as ``Test...`` next to a ``harness`` fixture."""

    @pytest.fixture
    def store(self, harness: Harness) -> Store:
        return harness.store

    def test_a_session_is_a_store_session_with_its_timeout(self, store: Store) -> None:
        with store.open_session(timedelta(seconds=LONG)) as session:
            assert isinstance(session, StoreSession)
            assert session.timeout == LONG
            assert not session.ended

    @pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), 10**9])
    def test_a_timeout_out_of_range_is_refused(self, store: Store, timeout: float) -> None:
        with pytest.raises(ValueError, match="timeout"):
            store.open_session(timeout)

    def test_a_timeout_that_is_not_a_duration_is_refused(self, store: Store) -> None:
        with pytest.raises(TypeError, match="timeout"):
            store.open_session("5")  # type: ignore[arg-type]

    def test_close_deletes_the_session_keys_then_pushes_its_wills(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        session = store.open_session(LONG)
        session.set("present/a", "token")
        session.add_will("departures", "a left")
        session.add_will("departures", "a really left")
        assert observer.get("present/a") == b"token"
        # Whoever the first will wakes already finds the key deleted.
        popper = Call(lambda: (observer.queue_pop("departures"), observer.check(["present/a"])))
        popper.assert_blocked()
        session.close()
        assert popper.outcome() == (b"a left", False)
        assert pushed(observer, "departures") == [b"a really left"]
        assert session.ended

    def test_set_with_will_is_a_set_and_a_will(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        session = store.open_session(LONG)
        session.add_will("departures", "a left")
        session.set_with_will("present/a", "token", "departures", "a really left")
        assert observer.get("present/a") == b"token"
        popper = Call(lambda: (observer.queue_pop("departures"), observer.check(["present/a"])))
        popper.assert_blocked()
        session.close()
        # Its key is owned by the session, its will pushed after the earlier one.
        assert popper.outcome() == (b"a left", False)
        assert pushed(observer, "departures") == [b"a really left"]
        with pytest.raises(SessionExpiredError):
            session.set_with_will("present/a", "again", "departures", "again")
        assert not observer.check(["present/a"])

    def test_set_with_will_push_and_get_does_all_three_at_once_or_none(
        self, harness: Harness
    ) -> None:
        store, observer = harness.store, harness.handle()
        store.set("lease", "held by b")
        session = store.open_session(LONG)

        def announce(get: str) -> bytes | None:
            return session.set_with_will_push_and_get(
                "present/a", "token", "departures", "a left",
                push_onto="mailbox", push="a joins", get=get,
            )  # fmt: skip

        try:
            assert announce("lease") == b"held by b"
        except UnsupportedOperationError:
            # Not offered: nothing was done, and the caller does the three one by one.
            session.close()
            for key in ("present/a", "mailbox", "departures"):
                assert not observer.check([key]), key
            return
        assert observer.get("present/a") == b"token"
        assert pushed(observer, "mailbox") == [b"a joins"]
        assert announce("missing") is None
        assert not observer.check(["missing"])  # read, not written
        popper = Call(lambda: (observer.queue_pop("departures"), observer.check(["present/a"])))
        popper.assert_blocked()
        session.close()
        # The key is owned by the session; both wills are pushed after its deletion.
        assert popper.outcome() == (b"a left", False)
        assert pushed(observer, "departures") == [b"a left"]
        with pytest.raises(SessionExpiredError):
            announce("lease")
        assert pushed(observer, "mailbox") == [b"a joins"]  # the second call's push only

    def test_set_with_will_push_and_get_claims_only_a_missing_key(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        store.set("lease", "held by b")
        first, second = store.open_session(LONG), harness.handle().open_session(LONG)

        def announce(session: StoreSession, name: str, get: str) -> bytes | None:
            return session.set_with_will_push_and_get(
                f"present/{name}", "token", "departures", f"{name} left",
                push_onto="mailbox", push=f"{name} joins", get=get, claim=f"taken by {name}",
            )  # fmt: skip

        try:
            assert announce(first, "a", "lease") == b"held by b"  # there: read, not claimed
        except UnsupportedOperationError:
            first.close()
            second.close()
            return
        assert announce(first, "a", "vacant") == b"taken by a"
        assert announce(second, "c", "vacant") == b"taken by a"  # it learns who took it
        assert pushed(observer, "mailbox") == [b"a joins", b"a joins", b"c joins"]
        first.close()
        second.close()
        # A plain key: it stays when the session that claimed it ends.
        assert observer.get("lease") == b"held by b"
        assert observer.get("vacant") == b"taken by a"

    def test_close_is_idempotent_and_ends_every_use(self, store: Store) -> None:
        session = store.open_session(LONG)
        session.add_will("departures", "gone")
        session.close()
        session.close()
        assert pushed(store, "departures") == [b"gone"]
        for use in (
            session.keep_alive,
            lambda: session.set("k", "v"),
            lambda: session.compare_set("k", "", "v"),
            lambda: session.add_will("departures", "again"),
        ):
            with pytest.raises(SessionExpiredError):
                use()
        assert not store.check(["k"])
        assert issubclass(SessionExpiredError, StoreConnectionError)

    def test_a_will_wakes_a_waiter_on_its_queue(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        session = store.open_session(LONG)
        session.add_will("departures", "gone")
        waiter = Call(lambda: observer.wait(["departures"], TIMEOUT))
        waiter.assert_blocked()
        session.close()
        waiter.outcome()

    def test_a_silent_session_ends_after_its_timeout(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        session = store.open_session(EXPIRING)
        session.set("present/a", "token")
        session.add_will("departures", "a left")
        started = time.monotonic()
        # Blocked on the will's queue: woken by the store, without any further call.
        assert observer.queue_pop("departures") == b"a left"
        assert time.monotonic() - started >= EXPIRING - 0.1
        assert not observer.check(["present/a"])
        with pytest.raises(SessionExpiredError):
            session.keep_alive()
        assert session.ended
        session.close()  # still fine, and pushes nothing more
        assert pushed(observer, "departures") == []

    def test_keep_alive_keeps_a_silent_session_open(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        session = store.open_session(EXPIRING)
        session.set("present/a", "token")
        session.add_will("departures", "a left")
        until = time.monotonic() + 2 * EXPIRING
        while time.monotonic() < until:
            session.keep_alive()
            time.sleep(0.05)
        assert observer.get("present/a") == b"token"
        assert observer.queue_len("departures") == 0
        session.close()
        assert pushed(observer, "departures") == [b"a left"]

    def test_ownership_moves_to_the_session_that_wrote_last(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        first, second = store.open_session(LONG), observer.open_session(LONG)
        first.set("lease", "first")
        first.keep_alive()  # a round trip: the write is done (a TCPStore's set is not answered)
        second.set("lease", "second")
        second.keep_alive()
        first.close()
        assert observer.get("lease") == b"second"
        second.close()
        assert not store.check(["lease"])

    def test_a_plain_write_makes_an_owned_key_ordinary(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        with store.open_session(LONG) as session:
            session.set("plain/set", "owned")
            session.set("plain/add", "1")
            session.set("deleted", "owned")
            session.keep_alive()  # the writes are done before the plain ones
            observer.set("plain/set", "ordinary")
            observer.add("plain/add", 1)
            observer.delete_key("deleted")
            observer.set("deleted", "ordinary")
        assert observer.get("plain/set") == b"ordinary"
        assert observer.get("plain/add") == b"2"
        assert observer.get("deleted") == b"ordinary"

    def test_compare_set_owns_the_key_only_when_it_writes(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        holder, contender = store.open_session(LONG), observer.open_session(LONG)
        assert holder.compare_set("lease", "", "holder") == b"holder"
        assert contender.compare_set("lease", "", "contender") == b"holder"
        contender.close()
        assert observer.get("lease") == b"holder"
        holder.close()
        assert not observer.check(["lease"])
        assert contender.ended

    def test_a_session_does_not_touch_what_it_never_wrote(self, harness: Harness) -> None:
        store, observer = harness.store, harness.handle()
        observer.set("ordinary", "v")
        with store.open_session(LONG) as session:
            assert session.compare_set("ordinary", "other", "mine") == b"v"
        assert observer.get("ordinary") == b"v"
