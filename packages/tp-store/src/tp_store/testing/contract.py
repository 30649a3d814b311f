"""The behaviour every ``tp_store.Store`` shares with PyTorch's ``c10d::Store``, as tests.

A store package runs the contract on its stores by subclassing
:class:`StoreContract` in one of its test modules (pytest collects the
subclass, named ``Test...``) and providing a ``harness`` fixture that yields a
:class:`Harness`: the store under test and the means to open more handles on
its data, so that tests can play several users. ``tp-store`` runs it on every
store it ships; other packages (``tp-rdzv-etcd``) on theirs.

This module needs ``pytest``, which ``tp-store`` itself does not depend on:
import it from tests only.
"""

from __future__ import annotations

import functools
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import chain
from typing import Generic, TypeVar

import pytest

from tp_store import QueueEmptyError, Store, StoreError, StoreTimeoutError

_T = TypeVar("_T")

#: Default timeout of the stores under test: long enough never to fire by accident.
TIMEOUT = 10.0
#: The timeout of operations that are meant to time out.
SHORT = 0.2
#: How long a call must stay blocked to count as blocked.
STILL_BLOCKED = 0.05


@dataclass
class Harness:
    """A store under test, and the means to open more handles on its data."""

    store: Store
    #: Opens another handle on the same data; picklable when ``crosses_processes``.
    opener: Callable[[], Store]
    crosses_processes: bool
    handles: list[Store] = field(default_factory=list)

    def handle(self) -> Store:
        """Another handle on the same data, closed when the test ends."""
        handle = self.opener()
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        """Close every handle opened through :meth:`handle`, then the store."""
        for store in [*reversed(self.handles), self.store]:
            store.close()


def add_many(opener: Callable[[], Store], key: str, count: int) -> list[int]:
    """Open a handle and ``add(key, 1)`` ``count`` times; return every result.

    Run in child processes (so it lives in an importable module).
    """
    with opener() as store:
        return [store.add(key, 1) for _ in range(count)]


class Call(threading.Thread, Generic[_T]):
    """A (blocking) call run in a thread, keeping its result or exception."""

    def __init__(self, function: Callable[[], _T]) -> None:
        super().__init__(daemon=True)
        self._function = function
        self._result: _T  # set by run() unless the call raised
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._result = self._function()
        except BaseException as exc:
            self._error = exc

    def assert_blocked(self) -> None:
        """Fail unless the call is still running a moment later."""
        self.join(STILL_BLOCKED)
        assert self.is_alive(), "the call returned at once"

    def outcome(self) -> _T:
        """What the call returned once it finishes; its exception is re-raised."""
        self.join(TIMEOUT)
        assert not self.is_alive(), "the call is still blocked"
        if self._error is not None:
            raise self._error
        return self._result


def assert_times_out(call: Callable[[], object], key: str, seconds: float = SHORT) -> None:
    """``call`` raises a ``StoreTimeoutError`` naming ``key`` after about ``seconds``."""
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        call()
    elapsed = time.monotonic() - started
    error = info.value
    assert isinstance(error, StoreTimeoutError)
    assert seconds - 0.02 <= elapsed < seconds + 2
    assert key in str(error)
    assert any(key in name for name in error.keys), error.keys


WRITERS: dict[str, Callable[[Store, str], object]] = {
    "set": lambda store, key: store.set(key, "v"),
    "add": lambda store, key: store.add(key, 1),
    "append": lambda store, key: store.append(key, "v"),
    "compare_set": lambda store, key: store.compare_set(key, "", "v"),
    "multi_set": lambda store, key: store.multi_set(["other", key], ["o", "v"]),
    "queue_push": lambda store, key: store.queue_push(key, "v"),
}


class StoreContract:
    """The contract tests; subclass as ``Test...`` next to a ``harness`` fixture."""

    @pytest.fixture
    def store(self, harness: Harness) -> Store:
        """The store under test."""
        return harness.store

    # -- set / get ---------------------------------------------------------------------
    def test_set_and_get_accept_str_and_bytes(self, store: Store) -> None:
        store.set("text", "value")
        store.set(b"raw", b"\x00\xff\n")
        assert store.get("text") == b"value"
        assert store.get(b"text") == b"value"
        assert store.get("raw") == b"\x00\xff\n"

    def test_values_are_binary_safe(self, store: Store) -> None:
        every_byte = bytes(range(256))
        store.set("all", every_byte)
        store.set("empty", b"")
        assert store.get("all") == every_byte
        assert store.get("empty") == b""

    def test_set_overwrites(self, store: Store) -> None:
        store.set("k", "first")
        store.set("k", "second")
        assert store.get("k") == b"second"

    def test_keys_come_back_as_str(self, store: Store) -> None:
        store.set("ключ", "v")
        store.set(b"\xff", "not UTF-8")
        assert store.get("ключ".encode()) == b"v"
        keys = store.list_keys()
        assert "ключ" in keys
        assert "\udcff" in keys  # undecodable bytes survive as surrogate escapes

    def test_keys_and_values_of_other_types_are_rejected(self, store: Store) -> None:
        with pytest.raises(TypeError):
            store.set(1, "v")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            store.set("k", 1)  # type: ignore[arg-type]

    def test_get_waits_for_the_key(self, harness: Harness) -> None:
        getter = Call(functools.partial(harness.handle().get, "late"))
        getter.assert_blocked()
        harness.store.set("late", "here")
        assert getter.outcome() == b"here"

    def test_get_times_out_naming_the_key(self, harness: Harness) -> None:
        handle = harness.handle()
        handle.set_timeout(SHORT)
        assert_times_out(lambda: handle.get("absent"), "absent")

    # -- wait / check ------------------------------------------------------------------
    def test_wait_get_waits_with_its_own_timeout(self, harness: Harness) -> None:
        assert_times_out(lambda: harness.store.wait_get("late", SHORT), "late")
        getter = Call(functools.partial(harness.handle().wait_get, "late", TIMEOUT))
        getter.assert_blocked()
        harness.store.set("late", b"\x00value")
        assert getter.outcome() == b"\x00value"
        assert harness.store.wait_get("late") == b"\x00value"

    def test_wait_returns_at_once_when_the_keys_exist(self, store: Store) -> None:
        store.set("a", "1")
        store.set("b", "2")
        store.wait(["a", b"b"])
        store.wait(["a"], timedelta(seconds=SHORT))
        store.wait(["a"], SHORT)
        store.wait([])

    @pytest.mark.parametrize("writer", list(WRITERS))
    def test_wait_is_released_by(self, harness: Harness, writer: str) -> None:
        waiter = Call(functools.partial(harness.handle().wait, ["first", "late"], TIMEOUT))
        harness.store.set("first", "1")
        waiter.assert_blocked()
        WRITERS[writer](harness.store, "late")
        waiter.outcome()

    def test_wait_times_out_naming_the_missing_key(self, harness: Harness) -> None:
        harness.store.set("present", "1")
        assert_times_out(lambda: harness.store.wait(["present", "missing"], SHORT), "missing")
        assert_times_out(
            lambda: harness.store.wait(["missing"], timedelta(seconds=SHORT)), "missing"
        )

    def test_check_never_blocks(self, store: Store) -> None:
        assert not store.check(["a"])
        store.set("a", "1")
        assert store.check(["a"])
        assert store.check([b"a"])
        assert not store.check(["a", "b"])
        store.set("b", "2")
        assert store.check(["a", "b"])
        assert store.check([])

    # -- add ---------------------------------------------------------------------------
    def test_add_keeps_a_decimal_counter(self, store: Store) -> None:
        assert store.add("n", 5) == 5
        assert store.add("n", -7) == -2
        assert store.get("n") == b"-2"
        assert store.add("zero", 0) == 0
        assert store.check(["zero"])
        store.set("text", "40")
        assert store.add(b"text", 2) == 42

    def test_add_on_a_non_integer_value_fails_naming_the_key(self, harness: Harness) -> None:
        harness.store.set("word", "abc")
        handle = harness.handle()  # a TCP server may drop the connection of the failed add
        with pytest.raises((ValueError, StoreError)) as info:
            handle.add("word", 1)
        if isinstance(info.value, ValueError):
            assert "word" in str(info.value)
        assert harness.store.get("word") == b"abc"

    def test_add_is_atomic_across_threads(self, harness: Harness) -> None:
        threads, adds = 8, 200
        start = threading.Barrier(threads)

        def add_many(handle: Store) -> list[int]:
            start.wait()
            return [handle.add("counter", 1) for _ in range(adds)]

        calls = [Call(functools.partial(add_many, harness.handle())) for _ in range(threads)]
        results = sorted(chain.from_iterable(call.outcome() for call in calls))
        assert results == list(range(1, threads * adds + 1))
        assert harness.store.get("counter") == str(threads * adds).encode()

    def test_add_is_atomic_across_processes(self, harness: Harness) -> None:
        if not harness.crosses_processes:
            pytest.skip("the store lives in this process only")
        processes, adds = 4, 200
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(processes, mp_context=context) as pool:
            futures = [
                pool.submit(add_many, harness.opener, "counter", adds) for _ in range(processes)
            ]
            results = sorted(chain.from_iterable(future.result(TIMEOUT) for future in futures))
        assert results == list(range(1, processes * adds + 1))
        assert harness.store.get("counter") == str(processes * adds).encode()

    @pytest.mark.parametrize("amount", ["1", b"1", 1.0, True, None])
    def test_add_refuses_an_amount_that_is_not_an_int_naming_it(
        self, store: Store, amount: object
    ) -> None:
        with pytest.raises(TypeError, match="amount"):
            store.add("c", amount)  # type: ignore[arg-type]
        assert not store.check(["c"])
        assert store.add("c", 1) == 1

    @pytest.mark.parametrize("amount", [2**63, -(2**63) - 1, 10**5000], ids=["max", "min", "huge"])
    def test_add_refuses_an_amount_outside_int64_naming_the_range(
        self, store: Store, amount: int
    ) -> None:
        # PyTorch's counters and the wire protocol's ADD are signed 64-bit.
        with pytest.raises(ValueError, match="amount must be in the signed 64-bit range"):
            store.add("c", amount)
        assert store.add("c", 2**63 - 1) == 2**63 - 1

    @pytest.mark.parametrize(
        ("operation", "name"),
        [
            (lambda store: store.wait("ab"), "keys"),
            (lambda store: store.check(b"ab"), "keys"),
            (lambda store: store.multi_get("ab"), "keys"),
            (lambda store: store.multi_set("ab", ["1", "2"]), "keys"),
            (lambda store: store.multi_set(["a", "b"], "12"), "values"),
            (lambda store: store.wait(None), "keys"),
        ],
        ids=["wait", "check", "multi_get", "multi_set-keys", "multi_set-values", "not-a-list"],
    )
    def test_a_lone_str_where_a_list_belongs_is_refused_naming_it(
        self, store: Store, operation: Callable[[Store], object], name: str
    ) -> None:
        # Never one key per character.
        store.multi_set(["a", "b"], ["x", "y"])
        with pytest.raises(TypeError, match=f"{name} must be a list"):
            operation(store)
        assert [store.get("a"), store.get("b")] == [b"x", b"y"]

    # -- compare_set / append / delete ---------------------------------------------------
    def test_compare_set_follows_pytorch(self, store: Store) -> None:
        # Missing key, non-empty expected: nothing is stored, expected comes back.
        assert store.compare_set("k", "old", "new") == b"old"
        assert not store.check(["k"])
        # Missing key, empty expected: the key is created.
        assert store.compare_set("k", "", "first") == b"first"
        assert store.get("k") == b"first"
        # Present key: swapped only on an exact match; the value after comes back.
        assert store.compare_set("k", "other", "second") == b"first"
        assert store.compare_set("k", "", "second") == b"first"
        assert store.get("k") == b"first"
        assert store.compare_set(b"k", b"first", b"second") == b"second"
        assert store.get("k") == b"second"
        store.set("empty", b"")
        assert store.compare_set("empty", "", "filled") == b"filled"

    def test_append_creates_then_concatenates(self, store: Store) -> None:
        store.append("log", "a")
        store.append("log", b"\x00b")
        assert store.get("log") == b"a\x00b"

    def test_delete_key_reports_whether_the_key_existed(self, store: Store) -> None:
        store.set("k", "v")
        assert store.delete_key("k") is True
        assert store.delete_key("k") is False
        assert store.delete_key("never") is False
        assert not store.check(["k"])

    def test_wait_blocks_again_after_delete(self, harness: Harness) -> None:
        store = harness.store
        store.set("k", "v")
        store.wait(["k"], SHORT)
        store.delete_key("k")
        assert_times_out(lambda: store.wait(["k"], SHORT), "k")
        waiter = Call(functools.partial(harness.handle().wait, ["k"], TIMEOUT))
        waiter.assert_blocked()
        store.set("k", "again")
        waiter.outcome()

    # -- counting and listing ----------------------------------------------------------
    def test_num_keys_and_list_keys_follow_writes(self, store: Store) -> None:
        count, listed = store.num_keys(), set(store.list_keys())
        store.set("a", "1")
        store.add("b", 1)
        store.append("c", "x")
        store.compare_set("d", "", "y")
        store.multi_set(["e"], ["z"])
        store.set("a", "overwritten")
        assert store.num_keys() == count + 5
        keys = store.list_keys()
        assert all(isinstance(key, str) for key in keys)
        assert set(keys) == listed | {"a", "b", "c", "d", "e"}
        store.delete_key("a")
        assert store.num_keys() == count + 4
        assert "a" not in store.list_keys()

    # -- multi_get / multi_set ---------------------------------------------------------
    def test_multi_set_then_multi_get_keep_order(self, store: Store) -> None:
        store.multi_set(["x", b"y", "z"], ["1", b"2", "3"])
        assert store.multi_get(["z", "x", b"y"]) == [b"3", b"1", b"2"]
        with pytest.raises(ValueError, match="values"):
            store.multi_set(["x", "y"], ["1"])

    def test_multi_get_waits_for_every_key(self, harness: Harness) -> None:
        getter = Call(functools.partial(harness.handle().multi_get, ["a", "b"]))
        harness.store.set("a", "1")
        getter.assert_blocked()
        harness.store.set("b", "2")
        assert getter.outcome() == [b"1", b"2"]

    # -- queues ------------------------------------------------------------------------
    def test_queue_is_first_in_first_out(self, store: Store) -> None:
        assert store.queue_len("q") == 0
        for value in ("1", b"2", "3"):
            store.queue_push("q", value)
        assert store.queue_len("q") == 3
        assert [store.queue_pop("q") for _ in range(3)] == [b"1", b"2", b"3"]
        assert store.queue_len(b"q") == 0

    def test_queue_pop_many_takes_the_oldest_values_without_waiting(self, store: Store) -> None:
        assert store.queue_pop_many("never", 5) == []
        for value in ("1", "2", "3", "4"):
            store.queue_push("q", value)
        assert store.queue_pop_many("q", 0) == []
        assert store.queue_pop_many("q", 3) == [b"1", b"2", b"3"]
        assert store.queue_pop_many("q", 3) == [b"4"]
        assert store.queue_len("q") == 0
        with pytest.raises(ValueError, match="count"):
            store.queue_pop_many("q", -1)

    def test_queue_pop_without_blocking_on_empty_raises(self, store: Store) -> None:
        with pytest.raises(QueueEmptyError):
            store.queue_pop("never", block=False)
        store.queue_push("q", "v")
        assert store.queue_pop("q", block=False) == b"v"
        with pytest.raises(QueueEmptyError):
            store.queue_pop("q", block=False)

    def test_queue_pop_times_out_naming_the_queue(self, harness: Harness) -> None:
        handle = harness.handle()
        handle.set_timeout(SHORT)
        assert_times_out(lambda: handle.queue_pop("empty"), "empty")

    def test_queue_push_wakes_one_popper_per_value(self, harness: Harness) -> None:
        pop_timeout = 0.6
        poppers = []
        for _ in range(3):
            handle = harness.handle()
            handle.set_timeout(pop_timeout)
            poppers.append(Call(functools.partial(handle.queue_pop, "jobs")))
        for popper in poppers:
            popper.assert_blocked()
        harness.store.queue_push("jobs", "a")
        harness.store.queue_push("jobs", "b")
        popped: list[bytes] = []
        timed_out = 0
        for popper in poppers:
            try:
                popped.append(popper.outcome())
            except StoreTimeoutError:
                timed_out += 1
        assert sorted(popped) == [b"a", b"b"]
        assert timed_out == 1
        assert harness.store.queue_len("jobs") == 0

    def test_a_queue_exists_for_wait_and_check_but_is_not_a_key(self, store: Store) -> None:
        count, listed = store.num_keys(), store.list_keys()
        store.queue_push("q", "v")
        assert store.check(["q"])
        store.wait(["q"], SHORT)
        assert store.num_keys() == count
        assert store.list_keys() == listed
        store.queue_pop("q")
        assert not store.check(["q"])

    # -- barrier -----------------------------------------------------------------------
    def test_barrier_releases_everyone_at_once(self, harness: Harness) -> None:
        size = 4
        callers = [
            Call(functools.partial(harness.handle().barrier, "gate", size, TIMEOUT))
            for _ in range(size - 1)
        ]
        for caller in callers:
            caller.assert_blocked()
        harness.store.barrier("gate", size, TIMEOUT)
        for caller in callers:
            caller.outcome()

    @pytest.mark.parametrize(
        ("world_size", "error"),
        [
            ("2", TypeError),
            (2.0, TypeError),
            (True, TypeError),
            (0, ValueError),
            (2**63, ValueError),
        ],
    )
    def test_barrier_refuses_a_world_size_that_is_not_a_positive_int64_naming_it(
        self, store: Store, world_size: object, error: type[Exception]
    ) -> None:
        with pytest.raises(error, match="world_size"):
            store.barrier("gate", world_size, SHORT)  # type: ignore[arg-type]
        assert not store.check(["gate"])

    def test_barrier_times_out_when_someone_is_missing(self, store: Store) -> None:
        assert_times_out(lambda: store.barrier("gate", 2, SHORT), "gate")

    # -- configuration, handles, lifetime ----------------------------------------------
    def test_timeout_is_a_timedelta_set_per_handle(self, harness: Harness) -> None:
        handle = harness.handle()
        assert handle.timeout == timedelta(seconds=TIMEOUT)
        handle.set_timeout(1.5)
        assert handle.timeout == timedelta(seconds=1.5)
        handle.set_timeout(timedelta(seconds=2))
        assert handle.timeout == timedelta(seconds=2)
        with pytest.raises(ValueError, match="negative"):
            handle.set_timeout(-1)
        assert harness.store.timeout == timedelta(seconds=TIMEOUT)

    def test_clone_shares_the_data(self, harness: Harness) -> None:
        twin = harness.store.clone()
        harness.handles.append(twin)
        assert twin.timeout == harness.store.timeout
        twin.set("k", "from the clone")
        assert harness.store.get("k") == b"from the clone"

    def test_a_handle_is_a_context_manager(self, harness: Harness) -> None:
        with harness.opener() as handle:
            handle.set("k", "v")
        assert harness.store.get("k") == b"v"

    def test_has_extended_api(self, store: Store) -> None:
        assert store.has_extended_api()
