"""The ``etcd`` backend across real node processes and real etcd clusters.

Every node is its own process (tp-rdzv-dynamic's ``dynamic_node.py``, which
builds its handler through ``tp_rdzv_api.create_handler``), talking to etcd
members started by the fixtures. Members and nodes die by ``SIGKILL``; every
read of a node's answer has a deadline, so a hang is a failure.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from dynamic_node import NodeFleet, NodeProcess

from tp_rdzv_etcd.local import LocalEtcd

pytestmark = pytest.mark.etcd

ADDR = "127.0.0.1"
ROUND_TIMEOUT = 60.0
Spawn = Callable[[str, dict[str, Any]], NodeProcess]


@pytest.fixture
def spawn_node() -> Iterator[Spawn]:
    """Start node processes; every one is gone after the test."""
    fleet = NodeFleet()
    yield fleet.spawn
    fleet.close()


def node_spec(
    endpoint: str, run_id: str, min_nodes: int, max_nodes: int, **config: Any
) -> dict[str, Any]:
    full: dict[str, Any] = {
        "join_timeout": 90,
        "read_timeout": 20,
        "last_call_timeout": 30,
        "keep_alive_interval": 0.5,
        "keep_alive_max_attempt": 4,
    }
    full.update(config)
    return {
        "backend": "etcd",
        "endpoint": endpoint,
        "run_id": run_id,
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "local_addr": ADDR,
        "config": full,
    }


def start(spawn: Spawn, count: int, spec: dict[str, Any]) -> list[NodeProcess]:
    nodes = [spawn(f"n{i}", spec) for i in range(count)]
    for node in nodes:
        ready = node.wait_ready()
        assert ready["backend"] == "etcd", ready
    return nodes


def collect(nodes: Sequence[NodeProcess], timeout: float, what: str) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    return {node.name: node.read(max(deadline - time.monotonic(), 0.01), what) for node in nodes}


def check_round(nodes: Sequence[NodeProcess], answers: dict[str, dict[str, Any]]) -> None:
    """One consistent round of exactly ``nodes``: same participants, ranks 0..n-1 once each."""
    first = answers[nodes[0].name]
    for node in nodes:
        answer = answers[node.name]
        assert "error" not in answer, f"{node.name}: {answer}\n{node.describe()}"
        assert answer["world_size"] == len(nodes), answer
        assert answer["participants"] == first["participants"], answer
        me = answer["participants"][answer["rank"]]
        assert re.fullmatch(rf"{re.escape(ADDR)}_{node.pid}_\d+", me), (node.name, me)
    ranks = sorted(answers[node.name]["rank"] for node in nodes)
    assert ranks == list(range(len(nodes))), ranks


def test_eight_nodes_rendezvous_on_one_member(etcd1: LocalEtcd, spawn_node: Spawn) -> None:
    spec = node_spec(etcd1.endpoints, f"e8-{uuid.uuid4().hex[:8]}", 6, 8)
    nodes = start(spawn_node, 8, spec)
    for node in nodes:
        node.send("next")
    answers = collect(nodes, ROUND_TIMEOUT, "the round of eight")
    check_round(nodes, answers)
    # Workers reach each other through RendezvousInfo.store, on etcd.
    for node in nodes:
        node.send("exchange")
    exchanged = collect(nodes, ROUND_TIMEOUT, "the exchange")
    participants = answers[nodes[0].name]["participants"]
    for name, answer in exchanged.items():
        assert answer.get("seen") == participants, f"{name}: {answer}"


def test_leader_killed_mid_rendezvous(
    make_cluster: Callable[[int], LocalEtcd], spawn_node: Spawn, etcd_summary: list[str]
) -> None:
    cluster = make_cluster(3)
    leader = cluster.leader()
    # The leader first in every node's list: the nodes talk to it until it dies.
    others = [member for member in cluster.members if member is not leader]
    endpoint = ",".join(member.client_url for member in [leader, *others])
    # A liveness bound (5 s) beyond an election: nobody counts as dead meanwhile.
    spec = node_spec(
        endpoint,
        f"lk-{uuid.uuid4().hex[:8]}",
        8,
        8,
        keep_alive_interval=1,
        keep_alive_max_attempt=5,
    )
    nodes = start(spawn_node, 8, spec)
    early, late = nodes[:5], nodes[5:]
    began = time.monotonic()
    for node in early:
        node.send("next")
    # The early five have joined an open round (it needs eight) once one of
    # them is the steward and the round counter reads their round: wait for
    # the steward's lease key through the cluster itself.
    from tp_rdzv_etcd import EtcdStore

    with EtcdStore(endpoint, f"/tp_rdzv/{spec['run_id']}/", timeout=30) as store:
        store.wait([f"tp_rdzv/{spec['run_id']}/pending"], 30)
    killed = time.monotonic()
    leader.kill()
    for node in late:
        node.send("next")
    answers = collect(nodes, ROUND_TIMEOUT, "the round after the leader died")
    done = max(answer["_arrived"] for answer in answers.values())
    check_round(nodes, answers)
    new_leader = cluster.leader()
    assert new_leader is not leader
    etcd_summary.append(
        f"leader-kill timeline (etcd 3-member, leader {leader.name} -> {new_leader.name}): "
        f"first next() at 0.00 s, leader kill -9 at {killed - began:.2f} s, "
        f"round of 8 complete at {done - began:.2f} s ({done - killed:.2f} s after the kill)"
    )


def test_etcd_down_is_a_connection_error(
    make_cluster: Callable[[int], LocalEtcd], spawn_node: Spawn
) -> None:
    cluster = make_cluster(1)
    read_timeout = 5.0
    spec = node_spec(
        cluster.endpoints, f"dn-{uuid.uuid4().hex[:8]}", 4, 4, read_timeout=read_timeout
    )
    nodes = start(spawn_node, 3, spec)
    for node in nodes:
        node.send("next")
    # Four needed, three came: everyone blocks.
    for node in nodes:
        assert node.poll(1.0) is None, f"{node.name} answered while the round needs four"
    killed = time.monotonic()
    cluster.stop()
    answers = collect(nodes, read_timeout + 5, "the error after etcd died")
    for name, answer in answers.items():
        assert answer.get("error") == "RendezvousConnectionError", f"{name}: {answer}"
        took = answer["_arrived"] - killed
        assert took <= read_timeout, f"{name} took {took:.1f} s (read timeout {read_timeout} s)"
    for node in nodes:
        after = node.request("waiting", read_timeout + 5)
        assert after.get("error") == "RendezvousConnectionError", after
