"""The dynamic rendezvous across real processes sharing one real store.

Every node is its own process (``dynamic_node.py``) with its own handler, built
through ``tp_rdzv_api.create_handler``; the store is the TCP server that one of
them hosts in-process on 127.0.0.1 (or a shared file). Nodes are killed with
``SIGKILL``, their wall clocks skewed, their joins timed out: nothing is mocked.
Every read of a child's answer has a deadline, so a hang is a failure, not a
stuck CI job.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from dynamic_node import NodeProcess

import tp_rdzv_api
from tp_rdzv_dynamic.status import RendezvousStatus

Spawn = Callable[..., NodeProcess]

ADDR = "127.0.0.1"
#: How long a round that should complete may take to come back (it normally takes < 2 s).
ROUND_TIMEOUT = 30.0
#: A join budget far beyond any test: joins that must not time out never do.
LONG_JOIN = 60.0
#: Liveness settings of the tests that kill nodes: a silent node is dead after 1 s.
KEEP_ALIVE_INTERVAL = 0.5
KEEP_ALIVE_MAX_ATTEMPT = 2


def _run_id() -> str:
    return f"mp-{uuid.uuid4().hex[:10]}"


def node_spec(
    endpoint: str,
    run_id: str,
    *,
    min_nodes: int,
    max_nodes: int,
    backend: str = "core",
    is_host: bool | None = None,
    clock_skew: float = 0.0,
    **config: Any,
) -> dict[str, Any]:
    """The spec of one node; ``config`` entries override the defaults below."""
    full: dict[str, Any] = {
        "join_timeout": LONG_JOIN,
        "read_timeout": 20,
        "keep_alive_interval": 0.5,
        "keep_alive_max_attempt": 4,
    }
    full.update(config)
    if is_host is not None:
        full["is_host"] = is_host
    return {
        "backend": backend,
        "endpoint": endpoint,
        "run_id": run_id,
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "local_addr": ADDR,
        "config": full,
        "clock_skew": clock_skew,
    }


def start_nodes(
    spawn: Spawn,
    specs: Sequence[tuple[str, dict[str, Any]]],
    *,
    host_first: bool = True,
) -> list[NodeProcess]:
    """Start one process per ``(name, spec)``; all are ready on return.

    With ``host_first`` the first spec's node is started (and ready, so its
    store server listens) before the others, which then start together.
    """
    nodes: list[NodeProcess] = []
    rest = list(specs)
    if host_first and rest:
        name, spec = rest.pop(0)
        host = spawn(name, spec)
        host.wait_ready()
        nodes.append(host)
    started = [spawn(name, spec) for name, spec in rest]
    for node in started:
        node.wait_ready()
    return nodes + started


def send_all(nodes: Sequence[NodeProcess], command: str) -> None:
    for node in nodes:
        node.send(command)


def collect(
    nodes: Sequence[NodeProcess], timeout: float, what: str = "an answer"
) -> dict[str, dict[str, Any]]:
    """One answer from each node, all within one ``timeout`` (seconds)."""
    deadline = time.monotonic() + timeout
    return {node.name: node.read(max(deadline - time.monotonic(), 0.01), what) for node in nodes}


def ask_all(
    nodes: Sequence[NodeProcess], command: str, timeout: float = ROUND_TIMEOUT
) -> dict[str, dict[str, Any]]:
    send_all(nodes, command)
    return collect(nodes, timeout, f"the answer to {command!r}")


def logging_to(path: Path, level: str = "INFO") -> dict[str, str]:
    """The spec keys that make a node log its structured events to ``path``, as JSON lines."""
    return {"log_level": level, "log_file": str(path), "log_format": "json"}


def logged_specs(
    endpoint: str, run_id: str, log_dir: Path, count: int, **options: Any
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Path]]:
    """``count`` specs of nodes ``n0``, ``n1``... of one run (``options`` go to
    :func:`node_spec`), each logging its structured events to a file of
    ``log_dir``; and those files by node name."""
    logs = {f"n{i}": log_dir / f"n{i}.jsonl" for i in range(count)}
    specs = [
        (name, node_spec(endpoint, run_id, **options) | logging_to(log))
        for name, log in logs.items()
    ]
    return specs, logs


def logged(paths: Sequence[Path], action: str) -> list[dict[str, Any]]:
    """The structured records of ``action`` in the logs at ``paths``.

    A line still being written is skipped.
    """
    records: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("action") == action:
                    records.append(record)
    return records


def found_gone(paths: Sequence[Path]) -> set[str]:
    """The nodes that stewards logging to ``paths`` learned were gone from the store
    (``node_gone`` records: their presence sessions ended)."""
    return {record["node"] for record in logged(paths, "node_gone")}


def found_removed(paths: Sequence[Path]) -> set[str]:
    """The nodes that stewards logging to ``paths`` removed as gone or dead.

    When two nodes die, the first's departure may reach a steward that is the
    second: it logs the removal in its own log before it dies, or dies before
    saving it, and then the next steward finds that node without a presence
    key, so by its counter (``node_dead``).
    """
    return found_gone(paths) | {record["node"] for record in logged(paths, "node_dead")}


def found_departed(paths: Sequence[Path]) -> set[str]:
    """The nodes that stewards logging to ``paths`` (at DEBUG) removed, or found gone
    when they were in no round any more: the survivors had opened the next round
    before the departure reached the steward, so there was nothing to remove."""
    return found_removed(paths) | {record["node"] for record in logged(paths, "departure_ignored")}


def assert_silent(nodes: Sequence[NodeProcess], seconds: float, why: str) -> None:
    """No node answers anything for ``seconds``."""
    deadline = time.monotonic() + seconds
    for node in nodes:
        answer = node.poll(max(deadline - time.monotonic(), 0.0))
        assert answer is None, f"{node.name} should still be blocked ({why}) but said {answer}"


def check_round(
    nodes: Sequence[NodeProcess], answers: dict[str, dict[str, Any]]
) -> list[NodeProcess]:
    """Assert one consistent round of exactly ``nodes``; return them in rank order."""
    for node in nodes:
        answer = answers[node.name]
        assert "error" not in answer, f"{node.name} failed next_rendezvous(): {answer}"
    first = answers[nodes[0].name]
    world = len(nodes)
    for node in nodes:
        answer = answers[node.name]
        assert answer["world_size"] == world, f"{node.name}: world_size in {answer}"
        assert answer["participants"] == first["participants"], (
            f"participants differ: {nodes[0].name} has {first['participants']}, "
            f"{node.name} has {answer['participants']}"
        )
        assert answer["bootstrap"] == first["bootstrap"], (
            f"bootstrap_store_info differs: {nodes[0].name} {first['bootstrap']}, "
            f"{node.name} {answer['bootstrap']}"
        )
        me = answer["participants"][answer["rank"]]
        node.node_id = me
        assert re.fullmatch(rf"{re.escape(ADDR)}_{node.pid}_\d+", me), (
            f"{node.name} (pid {node.pid}) has rank {answer['rank']} but participants"
            f"[{answer['rank']}] is {me!r}"
        )
    ranks = sorted(answers[node.name]["rank"] for node in nodes)
    assert ranks == list(range(world)), f"ranks are not 0..{world - 1} once each: {ranks}"
    assert len(set(first["participants"])) == world, first["participants"]
    bootstrap = first["bootstrap"]
    assert bootstrap is not None, "no bootstrap_store_info"
    assert isinstance(bootstrap[0], str), bootstrap
    assert bootstrap[0], bootstrap
    assert isinstance(bootstrap[1], int), bootstrap
    assert bootstrap[1] > 0, bootstrap
    return sorted(nodes, key=lambda node: answers[node.name]["rank"])


def natural_order(nodes: Sequence[NodeProcess]) -> list[NodeProcess]:
    """The documented rank order of newcomers on one address: by pid."""
    return sorted(nodes, key=lambda node: node.pid)


def check_exchange(ordered: Sequence[NodeProcess], answers: dict[str, dict[str, Any]]) -> None:
    """Every node read every rank's id through ``RendezvousInfo.store``."""
    expected = [answers[ordered[0].name]["participants"][r] for r in range(len(ordered))]
    exchanged = ask_all(ordered, "exchange")
    for node in ordered:
        answer = exchanged[node.name]
        assert "error" not in answer, f"{node.name}: exchange through info.store: {answer}"
        assert answer["seen"] == expected, f"{node.name} saw {answer['seen']}"


def values(nodes: Sequence[NodeProcess], command: str) -> dict[str, Any]:
    answers = ask_all(nodes, command)
    for name, answer in answers.items():
        assert "error" not in answer, f"{name}: {command}: {answer}"
    return {name: answer["value"] for name, answer in answers.items()}


# ---------------------------------------------------------------------------
# 1. One round of eight.
# ---------------------------------------------------------------------------


def test_eight_nodes_one_round(spawn_node: Spawn, free_port: int) -> None:
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()
    # min 6, max 8 with a last call beyond the wait for the answers: the round
    # can only complete by reaching max_nodes, and must do so at once.
    specs = [
        (
            f"n{i}",
            node_spec(
                endpoint,
                run_id,
                min_nodes=6,
                max_nodes=8,
                is_host=i == 0,
                last_call_timeout=2 * ROUND_TIMEOUT,
            ),
        )
        for i in range(8)
    ]
    nodes = start_nodes(spawn_node, specs)
    for node in nodes:
        assert node.ready["backend"] == "core"
        assert node.ready["run_id"] == run_id

    answers = ask_all(nodes, "next")
    ordered = check_round(nodes, answers)
    assert ordered == natural_order(nodes), (
        f"ranks should follow (addr, pid, local_id): {[n.pid for n in ordered]}"
    )
    for answer in answers.values():
        assert answer["wait_list"] == []
    check_exchange(ordered, answers)
    assert set(values(nodes, "waiting").values()) == {0}
    assert set(values(nodes, "closed?").values()) == {False}


# ---------------------------------------------------------------------------
# 2. A late joiner waits, is counted everywhere, and joins the next round.
# ---------------------------------------------------------------------------


def test_late_joiner_waits_then_joins_next_round(spawn_node: Spawn, free_port: int) -> None:
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()
    # min 6, max 9: eight nodes complete a round after the 1 s last call,
    # leaving room for a ninth, which therefore goes to the wait list.
    specs = [
        (
            f"n{i}",
            node_spec(
                endpoint, run_id, min_nodes=6, max_nodes=9, is_host=i == 0, last_call_timeout=1.5
            ),
        )
        for i in range(9)
    ]
    *nodes, late = start_nodes(spawn_node, specs)
    first = ask_all(nodes, "next")
    ordered = check_round(nodes, first)

    late.send("next")
    deadline = time.monotonic() + 15
    counts: dict[str, Any] = {}
    while time.monotonic() < deadline:
        counts = values(nodes, "waiting")
        if set(counts.values()) == {1}:
            break
        time.sleep(0.2)
    assert set(counts.values()) == {1}, f"num_nodes_waiting() after a 9th node came: {counts}"
    assert_silent([late], 0.5, "the round it came to was already complete")

    sent = time.monotonic()
    send_all(ordered, "next")
    everyone = [*ordered, late]
    second = collect(everyone, ROUND_TIMEOUT, "the second round")
    new_order = check_round(everyone, second)
    took = max(answer["_arrived"] for answer in second.values()) - sent
    assert took < 10, f"nine nodes reach max_nodes: the round completes at once; took {took:.1f} s"
    # Survivors first, in their previous order, then the newcomer.
    assert new_order == [*ordered, late], (
        f"ranks of round 2: {[n.name for n in new_order]}, round 1 was "
        f"{[n.name for n in ordered]} and {late.name} is new"
    )
    assert set(values(everyone, "waiting").values()) == {0}


# ---------------------------------------------------------------------------
# 3. Two participants die; the six survivors go on without them.
# ---------------------------------------------------------------------------


def test_survivors_reform_after_kill(spawn_node: Spawn, free_port: int, tmp_path: Path) -> None:
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()
    logs = {f"n{i}": tmp_path / f"n{i}.jsonl" for i in range(8)}
    specs = [
        (
            name,
            node_spec(
                endpoint,
                run_id,
                min_nodes=6,
                max_nodes=8,
                is_host=name == "n0",
                last_call_timeout=0.5,
                keep_alive_interval=KEEP_ALIVE_INTERVAL,
                keep_alive_max_attempt=KEEP_ALIVE_MAX_ATTEMPT,
            )
            | logging_to(log, "DEBUG"),
        )
        for name, log in logs.items()
    ]
    nodes = start_nodes(spawn_node, specs)
    host = nodes[0]
    ordered = check_round(nodes, ask_all(nodes, "next"))

    others = [node for node in ordered if node is not host]
    victims = [others[1], others[4]]
    survivors = [node for node in ordered if node not in victims]
    for victim in victims:
        victim.kill()
    send_all(survivors, "next")
    # The survivors' join timeout (LONG_JOIN) is beyond this wait: a survivor
    # that only got out by waiting it out fails here. How soon they re-form is
    # the kill scenario of benchmarks/rdzv_bench.py, not a test's assertion.
    answers = collect(survivors, ROUND_TIMEOUT, "the round after the kill")
    new_order = check_round(survivors, answers)
    assert new_order == survivors, (
        f"survivors must keep their relative order: before {[n.name for n in survivors]}, "
        f"after {[n.name for n in new_order]}"
    )
    dead = {victim.node_id for victim in victims}
    assert not dead & set(answers[survivors[0].name]["participants"])
    # A steward learned of each victim's death from the store (their sessions ended):
    # it removed it, or found it in no round (the survivors' joins came first). That
    # steward may be the other victim, which logged it before it died.
    missed = dead - found_departed(list(logs.values()))
    assert not missed, f"no steward removed {sorted(missed)}"
    check_exchange(new_order, answers)


def _observer(endpoint: str, run_id: str) -> Any:
    """A handler that only reads the run's status, as ``tp-rdzv status`` does.

    Never shut down: that would close the rendezvous.
    """
    return tp_rdzv_api.create_handler(
        tp_rdzv_api.RendezvousParameters(
            "core", endpoint, run_id, min_nodes=1, max_nodes=1, is_host=False
        )
    )


def _observe_until(
    observer: Any, what: str, condition: Callable[[RendezvousStatus], bool]
) -> RendezvousStatus:
    """The run's status once ``condition`` holds."""
    deadline = time.monotonic() + ROUND_TIMEOUT
    while True:
        status: RendezvousStatus = observer.status()
        if condition(status):
            return status
        assert time.monotonic() < deadline, f"{what} within {ROUND_TIMEOUT:g} s: {status}"
        time.sleep(0.05)  # polling the store: the event happens in other processes


def test_a_waiting_node_found_dead_by_mistake_joins_again(
    spawn_node: Spawn, free_port: int
) -> None:
    """A node stalled past the liveness bound while it waits (a paused VM, a
    swapping host) is dropped by the steward; once it runs again it must be
    seated in the round, not wait out its join timeout unseated."""
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()
    specs = [
        (
            f"n{i}",
            node_spec(
                endpoint,
                run_id,
                min_nodes=3,
                max_nodes=3,
                is_host=i == 0,
                keep_alive_interval=KEEP_ALIVE_INTERVAL,
                keep_alive_max_attempt=KEEP_ALIVE_MAX_ATTEMPT,
            ),
        )
        for i in range(3)
    ]
    host, stalled, late = start_nodes(spawn_node, specs)
    observer = _observer(endpoint, run_id)
    host.send("next")
    _observe_until(observer, "the host gathered", lambda s: len(s.participants) == 1)
    stalled.send("next")
    joined = _observe_until(observer, "both gathered", lambda s: len(s.participants) == 2)
    names = {node.node for node in joined.participants}
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        _observe_until(
            observer,
            "the stalled node dropped",
            lambda s: {node.node for node in s.participants} < names,
        )
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    late.send("next")
    nodes = [host, stalled, late]
    answers = collect(nodes, ROUND_TIMEOUT, "the round of all three")
    check_round(nodes, answers)


# ---------------------------------------------------------------------------
# 4. Nodes beyond max_nodes are redundant; closing sends them home.
# ---------------------------------------------------------------------------


def test_redundant_nodes_exit_gracefully_when_closed(spawn_node: Spawn, free_port: int) -> None:
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()

    def spec(i: int) -> dict[str, Any]:
        # The long last call means only max_nodes completes a round.
        return node_spec(
            endpoint, run_id, min_nodes=2, max_nodes=4, is_host=i == 0, last_call_timeout=30
        )

    nodes = start_nodes(spawn_node, [(f"n{i}", spec(i)) for i in range(6)])
    send_all(nodes, "next")
    # Exactly four answer; which four is up to the race.
    answers: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + ROUND_TIMEOUT
    while len(answers) < 4 and time.monotonic() < deadline:
        for node in nodes:
            if node.name not in answers:
                answer = node.poll(0.05)
                if answer is not None:
                    answers[node.name] = answer
    assert len(answers) == 4, f"4 of 6 nodes should form the round, got {sorted(answers)}"
    participants = [node for node in nodes if node.name in answers]
    redundant = [node for node in nodes if node.name not in answers]
    ordered = check_round(participants, answers)
    names = set(answers[ordered[0].name]["participants"])
    for node in redundant:
        assert not any(name.startswith(f"{ADDR}_{node.pid}_") for name in names), node
    assert_silent(redundant, 1.5, "they are beyond max_nodes")
    # The redundancy list is not the wait list: no restart is pending.
    assert set(values(ordered, "waiting").values()) == {0}

    closer = ordered[1]
    closed = closer.request("close")
    assert "error" not in closed, closed
    exits = collect(redundant, 15, "the end of a redundant node's next_rendezvous()")
    for name, answer in exits.items():
        assert answer.get("error") == "RendezvousGracefulExitError", f"{name}: {answer}"

    newcomer = spawn_node("late", spec(6))
    newcomer.wait_ready()
    late = newcomer.request("next", 15)
    assert late.get("error") == "RendezvousClosedError", f"a join after closing: {late}"
    again = ordered[2].request("next", 15)
    assert again.get("error") == "RendezvousClosedError", f"a participant re-joining: {again}"
    everyone = [*nodes, newcomer]
    assert set(values(everyone, "closed?").values()) == {True}


def test_a_spare_outwaits_its_join_timeout_and_takes_a_killed_nodes_rank(
    spawn_node: Spawn, free_port: int
) -> None:
    """A spare (beyond max_nodes) never times out while it waits: when a
    participant is killed, it gets a seat, with stable_ranks the dead node's
    rank, and the round completes at max_nodes without a last call (the last
    call is beyond the test's patience)."""
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()
    spare_join = 3.0

    def spec(is_host: bool = False, join_timeout: float = LONG_JOIN) -> dict[str, Any]:
        return node_spec(
            endpoint,
            run_id,
            min_nodes=1,
            max_nodes=2,
            is_host=is_host,
            join_timeout=join_timeout,
            last_call_timeout=LONG_JOIN,
            stable_ranks=True,
        )

    # The host only hosts the store, so that the node of rank 0 can be killed.
    _, first, second = start_nodes(
        spawn_node, [("host", spec(is_host=True)), ("p0", spec()), ("p1", spec())]
    )
    spare = spawn_node("spare", spec(join_timeout=spare_join))
    spare.wait_ready()
    victim, survivor = check_round([first, second], ask_all([first, second], "next"))
    spare.send("next")
    # Past its join timeout twice (it reads the state at each): still waiting.
    assert_silent([spare], 2 * spare_join + 1, "a spare has no join timeout")
    victim.kill()
    survivor.send("next")  # as an agent whose workers lost their peer
    answers = collect([survivor, spare], ROUND_TIMEOUT, "the round after the kill")
    check_round([survivor, spare], answers)
    assert answers[survivor.name]["rank"] == 1, "the survivor keeps its rank"
    assert answers[spare.name]["rank"] == 0, "the spare takes the killed node's rank"
    assert answers[spare.name]["elapsed"] > 2 * spare_join


# ---------------------------------------------------------------------------
# 5. A join that times out is rolled back.
# ---------------------------------------------------------------------------


def test_join_timeout_rolls_back(spawn_node: Spawn, free_port: int) -> None:
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()

    def spec(join_timeout: float, is_host: bool = False) -> dict[str, Any]:
        return node_spec(
            endpoint,
            run_id,
            min_nodes=3,
            max_nodes=3,
            is_host=is_host,
            join_timeout=join_timeout,
            last_call_timeout=1,
        )

    # The host only hosts the store: it never joins.
    host, early, later = start_nodes(
        spawn_node, [("host", spec(LONG_JOIN, True)), ("a", spec(2.0)), ("b", spec(3.5))]
    )
    send_all([early, later], "next")
    first = early.read(2.0 + 8, "a's join timeout")
    second = later.read(3.5 + 8, "b's join timeout")
    # Two nodes of the three needed: the open round never had min_nodes.
    for answer, budget in ((first, 2.0), (second, 3.5)):
        assert answer.get("error") == "RendezvousExhaustedError", answer
        assert answer["min_nodes"] == 3, answer
        assert budget - 0.25 <= answer["elapsed"] <= budget + 5, answer
    assert first["joined"] == 2, f"a timed out while a and b were gathered: {first}"
    assert second["joined"] == 1, f"b timed out after a's join was rolled back: {second}"
    for node in (host, early, later):
        assert node.request("waiting")["value"] == 0

    # Nothing of a or b is left: three fresh nodes are exactly the next round.
    fresh = start_nodes(
        spawn_node, [(f"f{i}", spec(LONG_JOIN)) for i in range(3)], host_first=False
    )
    answers = ask_all(fresh, "next")
    ordered = check_round(fresh, answers)
    assert ordered == natural_order(fresh)
    assert early.alive()
    assert later.alive()


# ---------------------------------------------------------------------------
# 6. The store host dies while the others wait.
# ---------------------------------------------------------------------------


def test_store_host_death_is_a_connection_error(spawn_node: Spawn, free_port: int) -> None:
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()
    read_timeout = 5.0

    def spec(i: int) -> dict[str, Any]:
        # Four needed, three come: everyone waits in next_rendezvous().
        return node_spec(
            endpoint, run_id, min_nodes=4, max_nodes=4, is_host=i == 0, read_timeout=read_timeout
        )

    host, *others = start_nodes(spawn_node, [(f"n{i}", spec(i)) for i in range(3)])
    send_all([host, *others], "next")
    assert_silent([host, *others], 1.5, "the round needs four nodes")
    killed = time.monotonic()
    host.kill()
    budget = read_timeout + 5
    answers = collect(others, budget, "the error after the store host died")
    for name, answer in answers.items():
        assert answer.get("error") == "RendezvousConnectionError", f"{name}: {answer}"
        took = answer["_arrived"] - killed
        assert took <= budget, f"{name} took {took:.1f} s"
    # Nothing hangs afterwards either.
    for name, after in ask_all(others, "waiting", budget).items():
        assert after.get("error") == "RendezvousConnectionError", f"{name}: {after}"
    for node in others:
        assert node.request("exit", 5)["cmd"] == "exit"
        node.proc.wait(timeout=10)


# ---------------------------------------------------------------------------
# 7. Hosts whose wall clocks disagree by two minutes.
# ---------------------------------------------------------------------------


def test_clock_skew_is_harmless(spawn_node: Spawn, free_port: int, tmp_path: Path) -> None:
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()
    # Skews beyond ROUND_TIMEOUT: a death judged on another host's wall clock
    # would come a minute late (the round after the kill is not collected) or
    # at once (live nodes dropped: not a round of exactly the survivors).
    skews = [60.0, -60.0, 0.0, 60.0, -60.0, 0.0]
    names = [f"n{i}{'+' if skew > 0 else '-' if skew < 0 else '='}" for i, skew in enumerate(skews)]
    logs = {name: tmp_path / f"{name}.jsonl" for name in names}
    specs = [
        (
            name,
            node_spec(
                endpoint,
                run_id,
                min_nodes=4,
                max_nodes=6,
                is_host=i == 0,
                clock_skew=skew,
                last_call_timeout=0.5,
                keep_alive_interval=KEEP_ALIVE_INTERVAL,
                keep_alive_max_attempt=KEEP_ALIVE_MAX_ATTEMPT,
            )
            | logging_to(logs[name], "DEBUG"),
        )
        for i, (name, skew) in enumerate(zip(names, skews, strict=True))
    ]
    nodes = start_nodes(spawn_node, specs)
    host = nodes[0]
    # The skew is really in place in each process.
    for node, skew in zip(nodes, skews, strict=True):
        info = node.request("info")
        now = time.time()
        for clock in ("time", "datetime_now", "utcnow"):
            assert abs(info[clock] - now - skew) < 5, f"{node.name} {clock}: {info}"
        assert abs(info["time_ns"] / 1e9 - now - skew) < 5, f"{node.name}: {info}"

    ordered = check_round(nodes, ask_all(nodes, "next"))
    assert ordered == natural_order(nodes)

    others = [node for node in ordered if node is not host]
    victims = [next(n for n in others if n.spec["clock_skew"] < 0), others[-1]]
    survivors = [node for node in ordered if node not in victims]
    for victim in victims:
        victim.kill()
    send_all(survivors, "next")
    answers = collect(survivors, ROUND_TIMEOUT, "the round after the kill")
    assert check_round(survivors, answers) == survivors
    dead = {victim.node_id for victim in victims}
    missed = dead - found_departed(list(logs.values()))
    assert not missed, f"no steward removed {sorted(missed)}"

    # One more round with no failure: the four keep their ranks.
    again = ask_all(survivors, "next")
    assert check_round(survivors, again) == survivors
    assert set(values(survivors, "waiting").values()) == {0}


# ---------------------------------------------------------------------------
# 8. The file store.
# ---------------------------------------------------------------------------


def test_file_store_round(spawn_node: Spawn, tmp_path: Path) -> None:
    endpoint = str(tmp_path / "rdzv.store")
    run_id = _run_id()
    spec = node_spec(endpoint, run_id, min_nodes=3, max_nodes=3, store_type="file")
    nodes = start_nodes(spawn_node, [(f"n{i}", spec) for i in range(3)], host_first=False)
    answers = ask_all(nodes, "next")
    ordered = check_round(nodes, answers)
    assert ordered == natural_order(nodes)
    check_exchange(ordered, answers)
    # A second round on the same file.
    assert check_round(nodes, ask_all(nodes, "next")) == ordered
    assert set(values(nodes, "closed?").values()) == {False}


# ---------------------------------------------------------------------------
# 9. The other backend names.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["p10d", "c10d"])
def test_other_backends_round(spawn_node: Spawn, free_port: int, backend: str) -> None:
    endpoint = f"{ADDR}:{free_port}"
    run_id = _run_id()
    specs = [
        (
            f"n{i}",
            node_spec(endpoint, run_id, min_nodes=2, max_nodes=3, backend=backend, is_host=i == 0),
        )
        for i in range(3)
    ]
    nodes = start_nodes(spawn_node, specs)
    for node in nodes:
        assert node.ready["backend"] == backend
    answers = ask_all(nodes, "next")
    ordered = check_round(nodes, answers)
    check_exchange(ordered, answers)
    assert set(values(nodes, "waiting").values()) == {0}
    # shutdown() closes the rendezvous, as PyTorch's does, for everyone.
    assert ordered[-1].request("shutdown")["value"] is True
    assert set(values(nodes, "closed?").values()) == {True}


# ---------------------------------------------------------------------------
# 10. Presence: paused and killed processes on a store with sessions; a
#     killed steward on a store without them.
# ---------------------------------------------------------------------------


def _steward(observer: Any, nodes: Sequence[NodeProcess]) -> NodeProcess:
    """The node process holding the steward lease, as ``status()`` names it."""
    key = _observe_until(observer, "a steward", lambda s: s.steward is not None).steward
    (steward,) = [node for node in nodes if node.node_id == key]
    return steward


def _three_in_a_round(
    spawn_node: Spawn, server: Any, tmp_path: Path, interval: float, attempts: int
) -> tuple[list[NodeProcess], Any, dict[str, Path]]:
    """Three logged node processes on ``server`` after their first round (in rank
    order), an observer of their run, and their logs; a silent node's session
    ends after ``interval`` x ``attempts`` seconds."""
    endpoint = f"{ADDR}:{server.port}"
    run_id = _run_id()
    specs, logs = logged_specs(
        endpoint,
        run_id,
        tmp_path,
        3,
        min_nodes=3,
        max_nodes=3,
        is_host=False,
        keep_alive_interval=interval,
        keep_alive_max_attempt=attempts,
    )
    nodes = start_nodes(spawn_node, specs, host_first=False)
    ordered = check_round(nodes, ask_all(nodes, "next"))
    return ordered, _observer(endpoint, run_id), logs


def test_a_paused_steward_is_still_a_participant(
    spawn_node: Spawn, server: Any, tmp_path: Path
) -> None:
    """A process stopped for 1 s, less than its session timeout (a debugger, a
    starved host), is slow, not dead: nobody removes it, not even when it is the
    steward, whose lease is held through a session of its own."""
    # Sessions end after 5 s of silence.
    ordered, observer, logs = _three_in_a_round(spawn_node, server, tmp_path, 1.0, 5)
    paused = _steward(observer, ordered)
    epoch = observer.status().steward_epoch
    others = [node for node in ordered if node is not paused]
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # the pause itself
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    # Nothing changes over more than a session timeout: no departure, no new steward.
    answers = ask_all(others, "change 7")
    assert {answer["value"] for answer in answers.values()} == {False}, answers
    status = observer.status()
    assert {node.node for node in status.participants} == {node.node_id for node in ordered}
    assert (status.steward, status.steward_epoch) == (paused.node_id, epoch)
    assert not logged(list(logs.values()), "node_gone")
    assert not logged(list(logs.values()), "presence_lost")
    # And it rendezvouses on with the others: the same three, the same ranks.
    assert check_round(ordered, ask_all(ordered, "next")) == ordered


def test_a_member_paused_past_its_session_timeout_joins_the_next_round(
    spawn_node: Spawn, server: Any, tmp_path: Path
) -> None:
    """A process stopped between rounds for longer than its session timeout (a
    paused VM) is gone: the store ends its session and closes its connection.
    Running again, its agent's next rendezvous seats it with the others, on a
    new connection and a new session, instead of failing on the closed one."""
    # Sessions end after 1 s of silence.
    ordered, observer, logs = _three_in_a_round(spawn_node, server, tmp_path, 0.5, 2)
    steward = _steward(observer, ordered)
    paused = next(node for node in ordered if node is not steward)
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        _observe_until(
            observer,
            "the paused node removed",
            lambda s: paused.node_id not in {node.node for node in s.participants},
        )
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    check_round(ordered, ask_all(ordered, "next"))
    assert logged([logs[paused.name]], "presence_lost")


def test_a_killed_stewards_lease_is_vacant_at_once(
    spawn_node: Spawn, server: Any, tmp_path: Path
) -> None:
    """SIGKILL of the steward's process: the store ends its sessions as the kernel
    closes its sockets, so the lease goes at once and the round is marked stale;
    the survivors re-form under a new steward without any silence being judged.
    The liveness bound here (a minute) is beyond every wait of this test."""
    endpoint = f"{ADDR}:{server.port}"
    run_id = _run_id()
    specs, logs = logged_specs(
        endpoint,
        run_id,
        tmp_path,
        4,
        min_nodes=2,
        max_nodes=4,
        is_host=False,
        last_call_timeout=0.5,
        keep_alive_interval=2.0,
        keep_alive_max_attempt=30,
    )
    nodes = start_nodes(spawn_node, specs, host_first=False)
    ordered = check_round(nodes, ask_all(nodes, "next"))
    observer = _observer(endpoint, run_id)
    steward = _steward(observer, ordered)
    epoch = observer.status().steward_epoch
    survivors = [node for node in ordered if node is not steward]
    send_all(survivors, "change 25")
    steward.kill()
    # The steward session's will marked the round stale: every agent wakes.
    woken = collect(survivors, ROUND_TIMEOUT, "the round going stale")
    assert {answer["value"] for answer in woken.values()} == {True}, woken
    answers = ask_all(survivors, "next")
    assert check_round(survivors, answers) == survivors
    survivor_logs = [logs[node.name] for node in survivors]
    elected = logged(survivor_logs, "steward_elected")
    assert elected, "no survivor took the steward's office"
    assert not logged(survivor_logs, "steward_takeover"), "a takeover judged a silence"
    assert found_gone(survivor_logs) == {steward.node_id}
    status = observer.status()
    assert status.steward in {node.node_id for node in survivors}
    assert status.steward_epoch > epoch


def test_without_sessions_a_deputy_takes_over_a_killed_stewards_lease(
    spawn_node: Spawn, tmp_path: Path
) -> None:
    """On a store without sessions (a file) the lease is judged by its silence.
    Between rounds nobody rendezvouses, so the nodes of ranks 0 and 1 watch it
    from their keep-alive ticks: one takes it over, finds the dead steward's
    counter silent, and marks the round stale, with the survivors idle."""
    endpoint = str(tmp_path / "rdzv.store")
    run_id = _run_id()
    specs, logs = logged_specs(
        endpoint,
        run_id,
        tmp_path,
        3,
        min_nodes=2,
        max_nodes=3,
        store_type="file",
        last_call_timeout=0.5,
        keep_alive_interval=KEEP_ALIVE_INTERVAL,
        keep_alive_max_attempt=KEEP_ALIVE_MAX_ATTEMPT,
    )
    nodes = start_nodes(spawn_node, specs, host_first=False)
    ordered = check_round(nodes, ask_all(nodes, "next"))
    observer = tp_rdzv_api.create_handler(
        tp_rdzv_api.RendezvousParameters(
            "core", endpoint, run_id, min_nodes=1, max_nodes=1, store_type="file"
        )
    )
    steward = _steward(observer, ordered)
    survivors = [node for node in ordered if node is not steward]
    steward.kill()
    # The survivors are idle: only their keep-alive ticks can notice.
    _observe_until(
        observer,
        "the dead steward removed",
        lambda s: steward.node_id not in {node.node for node in s.participants},
    )
    survivor_logs = [logs[node.name] for node in survivors]
    (takeover,) = logged(survivor_logs, "steward_takeover")
    deputies = {node.node_id for node in ordered[:2]}
    assert takeover["node"] in deputies
    assert {record["node"] for record in logged(survivor_logs, "node_dead")} == {steward.node_id}
    assert check_round(survivors, ask_all(survivors, "next")) == survivors
