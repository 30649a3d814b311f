"""The workers' bootstrap store in its own process: reset per round, bounded, no
secret, dying with its agent, and its death noticed by the agent.

Real processes throughout: the child is ``python -m
tp_rdzv_dynamic.node.bootstrap_child``, the killed agents are Python processes of
their own, the workers are our TCPStore clients.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from handler_threads import wait_until

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_dynamic.node import bootstrap_process
from tp_rdzv_dynamic.node.bootstrap_child import BOOTSTRAP_LIMITS
from tp_rdzv_dynamic.node.bootstrap_process import BootstrapProcess, BootstrapProcessError
from tp_rdzv_dynamic.torch_compat.torchrun import create_tp_handler
from tp_store import StoreConnectionError, TCPStore

#: Bounds for a loaded machine: a Python process may take seconds to start.
START_TIMEOUT = 60.0


def bootstrap_children(parent: int) -> set[int]:
    """The pids of ``parent``'s bootstrap store processes that are alive (other tests'
    handlers, never shut down, may still have theirs: compare before and after)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # gone meanwhile
        # The fields after the command name (in parentheses): state, ppid.
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and state != "Z" and b"bootstrap_child" in cmdline:
            found.add(int(entry.name))
    return found


def is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead, only not reaped by its new parent yet


def events(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if getattr(record, "action", "") == action]


@pytest.fixture
def process() -> Iterator[BootstrapProcess]:
    child = BootstrapProcess()
    yield child
    child.stop()


def test_each_round_gets_an_empty_store_from_the_same_process(process):
    first = process.host("127.0.0.1")
    worker = TCPStore("127.0.0.1", first, timeout=10)
    worker.set("default_pg/0//cpu//0/0", "round 1's address")
    second = process.host("127.0.0.1")
    assert second != first
    fresh = TCPStore("127.0.0.1", second, timeout=10)
    assert not fresh.check(["default_pg/0//cpu//0/0"])
    with pytest.raises(StoreConnectionError):  # round 1's server closed with its connections
        worker.get("default_pg/0//cpu//0/0")
    assert process.exit_status() is None
    fresh.close()
    worker.close()


def test_the_handler_hosts_in_one_child_for_all_its_rounds(make_node):
    others = bootstrap_children(os.getpid())
    handler = make_node(1, 1)
    first = handler.next_rendezvous().bootstrap_store_info
    (child,) = bootstrap_children(os.getpid()) - others
    second = handler.next_rendezvous().bootstrap_store_info
    assert second.port != first.port
    assert bootstrap_children(os.getpid()) - others == {child}
    worker = TCPStore(second.master_addr, second.port, timeout=10)
    worker.set("k", "v")
    worker.close()
    handler._bootstrap.shutdown()
    wait_until(lambda: not is_running(child), START_TIMEOUT)


def test_the_agent_notices_its_bootstrap_store_died_and_redoes_the_round(make_node, caplog):
    others = bootstrap_children(os.getpid())
    handler = make_node(1, 1)
    handler.next_rendezvous()
    (child,) = bootstrap_children(os.getpid()) - others
    assert handler.num_nodes_waiting() == 0
    os.kill(child, signal.SIGKILL)
    # torch's agent restarts its workers when nodes wait: the round is redone.
    wait_until(lambda: handler.num_nodes_waiting() >= 1, START_TIMEOUT)
    lost = events(caplog, "bootstrap_store_lost")
    assert len(lost) == 1
    assert lost[0].levelno == logging.ERROR
    assert "killed by SIGKILL" in lost[0].getMessage()
    handler.num_nodes_waiting()
    assert (
        len([r for r in caplog.records if getattr(r, "action", "") == "bootstrap_store_lost"]) == 1
    )

    again = handler.next_rendezvous().bootstrap_store_info
    worker = TCPStore(again.master_addr, again.port, timeout=10)
    worker.set("k", "v")
    worker.close()
    assert handler.num_nodes_waiting() == 0
    restarted = [
        r for r in caplog.records if getattr(r, "action", "") == "bootstrap_store_restarted"
    ]
    assert len(restarted) == 1


_AGENT = textwrap.dedent(
    """
    import os, sys, threading, time
    from tp_rdzv_dynamic.node.bootstrap_process import BootstrapProcess

    def start():
        global child
        child = BootstrapProcess()

    if sys.argv[1] == "thread":  # no PR_SET_PDEATHSIG: the pipe's end tells the child
        runner = threading.Thread(target=start)
        runner.start()
        runner.join()
    else:
        start()
    port = child.host("127.0.0.1")
    if sys.argv[2] == "fork":  # a forked worker holds the pipe's other end too
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
    print(child.pid, port, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize(
    ("started_from", "workers"),
    [("main", "none"), ("main", "fork"), ("thread", "none")],
)
def test_the_bootstrap_store_dies_with_its_agent_killed(started_from, workers, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(_AGENT)
    agent = subprocess.Popen(
        [sys.executable, str(script), started_from, workers],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert agent.stdout is not None
        child_pid, port = map(int, agent.stdout.readline().split())
        TCPStore("127.0.0.1", port, timeout=10).close()  # it serves
        agent.kill()
        agent.wait()
        wait_until(lambda: not is_running(child_pid), START_TIMEOUT)
        with pytest.raises(StoreConnectionError):
            TCPStore("127.0.0.1", port, timeout=1)
    finally:
        os.killpg(agent.pid, signal.SIGKILL)  # the forked worker too
        agent.wait()


def test_the_bootstrap_store_never_asks_for_the_rendezvous_secret(monkeypatch, tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("the rendezvous store's secret")
    monkeypatch.setenv("TP_STORE_SECRET", "the rendezvous store's secret")
    monkeypatch.setenv("TP_STORE_SECRET_FILE", str(secret_file))
    child = BootstrapProcess()
    try:
        port = child.host("127.0.0.1")
        # A worker as torch's: without any secret (ours would read the environment's).
        monkeypatch.delenv("TP_STORE_SECRET")
        monkeypatch.delenv("TP_STORE_SECRET_FILE")
        worker = TCPStore("127.0.0.1", port, timeout=10)
        worker.set("k", "v")
        assert worker.get("k") == b"v"
        worker.close()
    finally:
        child.stop()


def test_a_local_addr_it_cannot_bind_is_an_error_not_every_interface(process):
    with pytest.raises(Exception, match=r"cannot listen on 'node0\.invalid'"):
        process.host("node0.invalid")
    assert process.exit_status() is None  # the next round may still be hosted
    port = process.host("127.0.0.1")
    TCPStore("127.0.0.1", port, timeout=10).close()


def store_until_refused(store: TCPStore, value: bytes) -> tuple[int, str]:
    """How many ``value`` the store took before closing the connection over a limit, and
    the error our client raised."""
    for count in itertools.count():
        try:
            store.set(f"fill{count}", value)
            store.check(["MASTER_KEY"])  # SET has no reply: a refusal shows here
        except StoreConnectionError as exc:
            return count, str(exc)
    raise AssertionError("unreachable")


def test_a_client_storing_all_it_can_is_stopped_at_the_budget(process):
    port = process.host("127.0.0.1")
    worker = TCPStore("127.0.0.1", port, timeout=30)
    worker.set("MASTER_KEY", "an early worker's key")
    filler = TCPStore("127.0.0.1", port, timeout=30)
    value = b"x" * BOOTSTRAP_LIMITS.max_value_bytes
    stored, error = store_until_refused(filler, value)
    assert "max_stored_bytes" in error
    assert 0 < stored * len(value) <= BOOTSTRAP_LIMITS.max_stored_bytes
    assert worker.get("MASTER_KEY") == b"an early worker's key"
    assert process.exit_status() is None
    worker.close()


def test_under_torchrun_the_process_starts_with_the_handler(free_port):
    # An agent's one handler: its child is ready before the first round it hosts.
    others = bootstrap_children(os.getpid())
    handler = create_tp_handler(
        RendezvousParameters(
            "tp",
            f"127.0.0.1:{free_port}",
            "job",
            min_nodes=1,
            max_nodes=1,
            local_addr="127.0.0.1",
            config={"is_host": True, "last_call_timeout": 0.1},
        )
    )
    try:
        (child,) = bootstrap_children(os.getpid()) - others
        info = handler.next_rendezvous()
        assert bootstrap_children(os.getpid()) - others == {child}
        TCPStore("127.0.0.1", info.bootstrap_store_info.port, timeout=10).close()
    finally:
        handler.shutdown()
    wait_until(lambda: not is_running(child), START_TIMEOUT)


def test_a_child_that_does_not_answer_is_ended(monkeypatch):
    child = BootstrapProcess()
    try:
        child.host("127.0.0.1")  # started: within the usual bound
        monkeypatch.setattr(bootstrap_process, "ANSWER_TIMEOUT", 1.0)
        os.kill(child.pid, signal.SIGSTOP)  # hung: its answer could come late
        with pytest.raises(BootstrapProcessError, match="did not answer within 1 s"):
            child.host("127.0.0.1")
        assert child.exit_status() is not None  # never asked again
    finally:
        child.stop()


def test_an_agent_with_many_descriptors_hosts(tmp_path):
    # select() cannot watch a descriptor past 1024; an agent's connections may push its
    # pipes there.
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
            if held[-1] > 1100:
                break
        child = BootstrapProcess()
        try:
            TCPStore("127.0.0.1", child.host("127.0.0.1"), timeout=10).close()
        finally:
            child.stop()
    finally:
        for fd in held:
            os.close(fd)


def test_the_node_keeps_alive_while_its_child_is_slow_to_answer(process):
    process.host("127.0.0.1")
    os.kill(process.pid, signal.SIGSTOP)  # slow as a child starting on a loaded machine
    resume = threading.Timer(1.0, os.kill, (process.pid, signal.SIGCONT))
    resume.start()
    beats: list[float] = []
    try:
        port = process.host("127.0.0.1", beats.append, 0.1)
    finally:
        resume.join()
    assert len(beats) >= 3  # about ten in that second
    TCPStore("127.0.0.1", port, timeout=10).close()
