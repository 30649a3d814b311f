"""A node that calls ``next_rendezvous()`` again at once gets a new round.

Found by the chaos suite (heartbeat trials): the steward publishes a round's
outcome before it moves the lease's round hint, so a node re-joining right
away could read the old hint, have its join taken as a repeat, and get back
the round it already held while its peers waited for a new one (and then hung
until their join timeout). Three agents here re-join as fast as they can.
"""

from __future__ import annotations

import socket
import threading
import uuid

from tp_rdzv_api import RendezvousHandler, RendezvousParameters, create_handler

ROUNDS = 30
NODES = 3


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_an_immediate_rejoin_gets_a_new_round() -> None:
    endpoint = f"127.0.0.1:{_free_port()}"
    run_id = f"rejoin-{uuid.uuid4().hex[:8]}"

    def handler(host: bool) -> RendezvousHandler:
        params = RendezvousParameters(
            "core",
            endpoint,
            run_id,
            min_nodes=NODES,
            max_nodes=NODES,
            local_addr="127.0.0.1",
            is_host=host,
            keep_alive_interval=0.2,
            last_call_timeout=0.3,
            join_timeout=10,
            read_timeout=20,
        )
        return create_handler(params)

    handlers = [handler(index == 0) for index in range(NODES)]
    seen: list[list[tuple[int, list[str]]]] = [[] for _ in handlers]
    failures: list[BaseException] = []

    def agent(index: int) -> None:
        try:
            for _ in range(ROUNDS):
                info = handlers[index].next_rendezvous()
                round_ = getattr(handlers[index], "round", None)
                assert isinstance(round_, int), f"no round after next_rendezvous(): {round_!r}"
                seen[index].append((round_, [str(node) for node in info.participants]))
        except BaseException as exc:  # reported below, with the thread's name
            failures.append(exc)

    threads = [threading.Thread(target=agent, args=(index,)) for index in range(NODES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    try:
        assert not any(thread.is_alive() for thread in threads), "an agent hung"
        assert not failures, failures
        for rounds in seen:
            numbers = [round_ for round_, _ in rounds]
            assert numbers == sorted(set(numbers)), f"a node got a round twice: {numbers}"
        # Every node was in every round, and all agree on each one's members.
        assert [r for r, _ in seen[0]] == [r for r, _ in seen[1]] == [r for r, _ in seen[2]]
        for same_round in zip(*seen, strict=True):
            assert len({tuple(members) for _, members in same_round}) == 1, same_round
    finally:
        for handler_ in reversed(handlers):
            handler_.shutdown()
