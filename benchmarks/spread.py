"""The spread scenario of ``rdzv_bench.py``: N nodes over P processes, the server alone.

As on a real cluster, minus the network: every node has its own handler and
its own store connection, ``N/P`` node threads share each of ``P`` node
processes, and the store server runs alone in a process of its own (ours:
``python -m tp_store``; torch's: a libuv master, as in ``store_bench.py``).
min = max = N. The bench writes ``go`` to every node process at once; each node
stamps its return on ``CLOCK_MONOTONIC``, which is system-wide, so every node's
time from the start signal to its return is known. The server's CPU seconds
(``/proc/<pid>/stat``) and the node processes' (``getrusage``) are measured
over the same span.

With ``victims``, that many nodes run in processes of their own; after the
first round they are killed with SIGKILL and the survivors call
``next_rendezvous()`` again (min = N - victims): the recovery is the time from
the kill to the last survivor's return, the detection the time from the kill
to the steward's record of the last victim's removal (``departures.py``: every
node process notes those records and reports them when asked).

The round's time is split with the steward's records (``round_decided``,
``round_published``, noted by the process that holds the steward): *joins*, from
the start signal until the steward began the batch that completed the round;
*decision*, that batch decided and the state saved; *answers*, from then until
the last node returned (the round's roster, answers and outcome written,
``publish``, and every node woken, reading its answer, returning). The server's
bytes sent in the round come from its STATS.

Node processes are this file run as a script (``spread.py node ...``). With
``profile`` (a directory), every node process and the server run under
``py-spy record`` (collapsed stacks, ``node-<slot>.txt`` and ``server.txt``).
``idle_bench.py`` uses the same node processes (:class:`SpreadGroup`), also on
etcd (the spec's ``store``), and has them watch with ``wait_for_change()``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from departures import Departure, removal_times, watch_departures
from hostinfo import load_average
from node_messages import NodeProcess, send_message
from store_bench import child_env, start_server

#: Keep-alive settings of the first-round cases: no tick falls in a round that works.
ROUND_CONFIG = {"keep_alive_interval": 5, "keep_alive_max_attempt": 3, "last_call_timeout": 1}
#: Those of the kill case: dead nodes are found within 2 s.
KILL_CONFIG = {"keep_alive_interval": 1, "keep_alive_max_attempt": 2, "last_call_timeout": 0.5}
#: Nodes per victim process in the kill case.
VICTIMS_PER_PROCESS = 50
#: How long one ``wait_for_change()`` call of a watching node waits.
WATCH_SECONDS = 60.0


@dataclass
class SpreadCase:
    """N nodes over P processes (and, to kill, ``victims`` more in processes of their own)."""

    nodes: int
    processes: int
    victims: int = 0

    @property
    def name(self) -> str:
        text = f"spread {self.nodes} nodes / {self.processes} processes"
        return f"{text}, SIGKILL {self.victims}" if self.victims else text

    @classmethod
    def parse(cls, text: str) -> SpreadCase:
        """``N:P`` or ``N:P:K`` (K nodes killed after the first round)."""
        try:
            parts = [int(part) for part in text.split(":")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"want N:P or N:P:K, got {text!r}") from None
        if len(parts) not in (2, 3) or min(parts[:2]) < 1 or parts[0] < parts[1]:
            raise argparse.ArgumentTypeError(f"want N:P or N:P:K with N >= P >= 1, got {text!r}")
        case = cls(*parts)
        if case.victims and not 0 < case.victims < case.nodes:
            raise argparse.ArgumentTypeError(f"K must be between 1 and N - 1, got {text!r}")
        return case


@dataclass
class SpreadResult:
    """What one spread run measured (seconds unless said otherwise)."""

    first: float  # the first node's return, from the start signal
    last: float  # the last node's
    returns: list[float]  # every node's, sorted
    server_cpu: float  # the server process's CPU seconds over the round
    nodes_cpu: float  # all node processes' CPU seconds over the round
    load: list[float] | None  # load averages at the end
    ops: dict[str, int] = field(default_factory=dict)  # our server's requests in the round
    nodes: int = 0  # the round's size
    bytes_sent: int | None = None  # our server's bytes sent in the round
    split: dict[str, float] = field(default_factory=dict)  # joins, decision, publish, answers
    removed: list[str] = field(default_factory=list)  # nodes a removal record named in the round
    recovery: float | None = None  # kill case: from the kill to the last survivor's return
    detection: float | None = None  # kill case: from the kill to the last victim's removal
    detected: int = 0  # kill case: how many victims a removal record named
    connections: int | None = None  # our server's open connections once every node returned
    nodes_cpu_system: float = 0.0  # of nodes_cpu, the kernel's
    node_switches: int = 0  # the node processes' context switches over the round

    def to_json(self) -> dict[str, Any]:
        return {
            "first": round(self.first, 4),
            "last": round(self.last, 4),
            "returns": [round(value, 4) for value in self.returns],
            "server_cpu": round(self.server_cpu, 3),
            "nodes_cpu": round(self.nodes_cpu, 3),
            "load": self.load,
            "ops": self.ops,
            "nodes": self.nodes,
            "server_cpu_ms_per_node": round(1000 * self.server_cpu / self.nodes, 4),
            "nodes_cpu_ms_per_node": round(1000 * self.nodes_cpu / self.nodes, 4),
            "nodes_cpu_system": round(self.nodes_cpu_system, 3),
            # Each a thread giving up the CPU (a wait, or the GIL) or made to.
            "switches_per_node": round(self.node_switches / self.nodes, 1),
            "bytes_sent": self.bytes_sent,
            "bytes_sent_per_node": (
                None if self.bytes_sent is None else round(self.bytes_sent / self.nodes)
            ),
            "split": {name: round(value, 4) for name, value in self.split.items()},
            "removed": self.removed,
            "recovery": None if self.recovery is None else round(self.recovery, 4),
            "detection": None if self.detection is None else round(self.detection, 4),
            "detected": self.detected,
            "connections": self.connections,
            "connections_per_node": (
                None if self.connections is None else round(self.connections / self.nodes, 3)
            ),
        }


# -- the bench's side -------------------------------------------------------------------


@dataclass(frozen=True)
class StoreProcess:
    """The store the nodes use: where it listens and the process measured.

    ``store`` is the client the nodes open: ``tcp`` (a TCPStore of ``impl``),
    ``etcd`` (an ``EtcdStore``, ``endpoint`` being its URLs) or ``etcd-v2``
    (torch's backend of that name, python-etcd on etcd's v2 API); ``requests``
    reads our server's request counts by operation, ``sent`` its bytes sent,
    ``connections`` its open connections, when it is ours.
    """

    endpoint: str
    pid: int
    store: str = "tcp"
    requests: Callable[[], dict[str, int]] | None = None
    sent: Callable[[], int] | None = None
    connections: Callable[[], int] | None = None


class RequestCounts:
    """Our server's request counts by operation so far (STATS), read over a connection
    of its own, opened once: the counts then hold no connection set-up of ours."""

    def __init__(self, host: str, port: int) -> None:
        from tp_store import TCPStore

        self._client = TCPStore(host, port, timeout=60)

    def __call__(self) -> dict[str, int]:
        return dict(self._client.server_stats()["ops"])

    def bytes_sent(self) -> int:
        return self._client.server_stats()["bytes_sent"]

    def connections_open(self) -> int:
        """The server's open connections, less this reader's own."""
        return self._client.server_stats()["connections_open"] - 1

    def close(self) -> None:
        self._client.close()


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def collect(
    inbox: queue.Queue[tuple[int, dict]], event: str, slots: Sequence[int], deadline: float
) -> dict[int, dict]:
    """The next ``event`` message of each of ``slots``; ``TimeoutError`` at ``deadline``."""
    found: dict[int, dict] = {}
    while len(found) < len(slots):
        try:
            slot, message = inbox.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            missing = sorted(set(slots) - found.keys())
            raise TimeoutError(f"no {event!r} from node processes {missing}") from None
        if slot not in slots:
            continue
        if message["event"] == event:
            found[slot] = message
        elif message["event"] in {"error", "eof"}:
            detail = message.get("error", "the process exited")
            raise RuntimeError(f"node process {slot} failed waiting for {event!r}: {detail}")
    return found


def round_split(records: Sequence[dict], started: float, last: float) -> dict[str, float]:
    """The round's time split from the steward's records (see the module's note);
    empty when no process logged them (torch)."""
    decided = [r for r in records if r["action"] == "round_decided"]
    complete = [r for r in records if r["action"] == "round_published"]
    if not decided or not complete:
        return {}
    first = min(decided, key=lambda record: record["monotonic"])
    decision_began = first["monotonic"] - first["duration"]
    return {
        "joins": decision_began - started,
        "decision": first["duration"],
        "publish": min(complete, key=lambda record: record["monotonic"])["duration"],
        "answers": last - first["monotonic"],
    }


def split(count: int, parts: int) -> list[int]:
    """``count`` nodes over ``parts`` processes, as evenly as can be."""
    return [count // parts + (1 if index < count % parts else 0) for index in range(parts)]


def run_spread(
    impl: str,
    case: SpreadCase,
    timeout: float,
    run_id: str,
    profile: Path | None = None,
    *,
    switch_interval: float | None = None,
) -> SpreadResult:
    """Run ``case`` for ``impl``; raises ``TimeoutError`` past ``timeout`` seconds a round."""
    min_nodes = case.nodes - case.victims
    counts = split(min_nodes, case.processes)
    victims = split(case.victims, -(-case.victims // VICTIMS_PER_PROCESS)) if case.victims else []
    spec = {
        "impl": impl,
        "run_id": run_id,
        "min_nodes": min_nodes,
        "max_nodes": case.nodes,
        "config": KILL_CONFIG if case.victims else ROUND_CONFIG,
        "timeout": timeout,
    }
    if switch_interval is not None:
        spec["switch_interval"] = switch_interval
    with start_server(impl, timeout) as server:
        requests = RequestCounts(server.host, server.port) if impl == "ours" else None
        store = StoreProcess(
            f"{server.host}:{server.port}",
            server.proc.pid,
            requests=requests,
            sent=None if requests is None else requests.bytes_sent,
            connections=None if requests is None else requests.connections_open,
        )
        group = SpreadGroup(store, timeout, profile)
        try:
            for count in [*counts, *victims]:
                group.start(spec | {"count": count})
            group.collect("ready", group.slots, max(timeout, 120))
            result = group.first_round(case.nodes)
            if victims:
                group.recover(result, group.slots[len(counts) :], min_nodes)
            return result
        finally:
            group.stop()
            if requests is not None:
                requests.close()


class SpreadGroup:
    """The node processes of one run, the store they use, and their messages."""

    def __init__(self, server: StoreProcess, timeout: float, profile: Path | None) -> None:
        self.server = server
        self.timeout = timeout
        self.profile = profile
        self.inbox: queue.Queue[tuple[int, dict]] = queue.Queue()
        self.nodes: list[NodeProcess] = []
        self.profilers = [] if profile is None else [self._profile_server()]

    @property
    def slots(self) -> list[int]:
        return [node.slot for node in self.nodes]

    def start(self, spec: dict[str, Any]) -> None:
        """A node process of ``spec`` (less the store's endpoint and kind, added here)."""
        spec = spec | {"endpoint": self.server.endpoint, "store": self.server.store}
        script = [sys.executable, str(Path(__file__).resolve()), "node", json.dumps(spec)]
        command = [*self._profiled(f"node-{len(self.nodes)}"), *script]
        self.nodes.append(NodeProcess(len(self.nodes), command, self.inbox, child_env()))

    def collect(self, event: str, slots: Sequence[int], timeout: float) -> dict[int, dict]:
        return collect(self.inbox, event, slots, time.monotonic() + timeout)

    def first_round(self, size: int) -> SpreadResult:
        """Every node's first round, from one start signal; verified."""
        requests = self.server.requests or dict
        ops_before = requests()
        sent = self.server.sent or (lambda: 0)
        sent_before = sent()
        server_cpu = process_cpu_seconds(self.server.pid)
        started = time.monotonic()
        for node in self.nodes:
            node.tell("next")
        joined = self.collect("joined", self.slots, self.timeout)
        server_cpu = process_cpu_seconds(self.server.pid) - server_cpu
        ops = requests()
        # Less the STATS replies of this bench (a few hundred bytes each).
        bytes_sent = sent() - sent_before if self.server.sent else None
        connections = self.server.connections() if self.server.connections else None
        returns = sorted(at - started for message in joined.values() for at in message["at"])
        self._verify(joined, size)
        records = [record for message in joined.values() for record in message.get("rounds", [])]
        # Every node of the round is alive: a removal of one in it is a false death.
        for slot in self.slots:
            self.nodes[slot].tell("departures")
        reported = self.collect("departures", self.slots, self.timeout)
        removed = sorted(
            {
                item["node"]
                for message in reported.values()
                for item in message["records"]
                if Departure.from_json(item).is_removal
            }
        )
        return SpreadResult(
            first=returns[0],
            last=returns[-1],
            returns=returns,
            server_cpu=server_cpu,
            nodes_cpu=sum(message["cpu"] for message in joined.values()),
            nodes_cpu_system=sum(message["cpu_system"] for message in joined.values()),
            node_switches=sum(message["switches"] for message in joined.values()),
            load=load_average(),
            ops={op: count - ops_before.get(op, 0) for op, count in ops.items() if count},
            nodes=size,
            bytes_sent=bytes_sent,
            split=round_split(records, started, started + returns[-1]),
            removed=removed,
            connections=connections,
        )

    def recover(self, result: SpreadResult, victims: Sequence[int], survivors: int) -> None:
        """SIGKILL the processes of ``victims``; note in ``result`` the seconds until every
        survivor's next round and until the removal of the last victim."""
        killed_at = time.monotonic()
        for slot in victims:
            os.kill(self.nodes[slot].proc.pid, signal.SIGKILL)
        alive = [slot for slot in self.slots if slot not in victims]
        for slot in alive:
            self.nodes[slot].tell("next")
        joined = self.collect("joined", alive, self.timeout)
        self._verify(joined, survivors)
        result.recovery = max(at for message in joined.values() for at in message["at"]) - killed_at
        for slot in alive:
            self.nodes[slot].tell("departures")
        reported = self.collect("departures", alive, self.timeout)
        noted = [Departure.from_json(item) for m in reported.values() for item in m["records"]]
        pids = [self.nodes[slot].proc.pid for slot in victims]
        removed = removal_times(noted, pids, killed_at)
        result.detected = len(removed)
        result.detection = max(removed.values()) - killed_at if removed else None

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        for profiler in self.profilers:
            profiler.send_signal(signal.SIGINT)
            profiler.wait()

    def _verify(self, joined: dict[int, dict], size: int) -> None:
        """Ranks 0..size-1 once each, world size ``size``, one participant list (ours)."""
        for slot in joined:
            self.nodes[slot].tell("digest")
        digested = self.collect("digests", list(joined), self.timeout)
        reports = list(joined.values())
        ranks = sorted(rank for report in reports for rank in report["ranks"])
        if ranks != list(range(size)):
            raise RuntimeError(f"ranks are not 0..{size - 1} once each: {ranks[:20]}")
        worlds = {world for report in reports for world in report["world_sizes"]}
        if worlds != {size}:
            raise RuntimeError(f"world sizes {sorted(worlds)}, expected {size}")
        digests = {digest for report in digested.values() for digest in report["participants"]}
        if len(digests) > 1:
            raise RuntimeError(f"{len(digests)} different participant lists")

    def _profiled(self, name: str) -> list[str]:
        """The command prefix that runs a process under py-spy (on-GIL samples), if profiling."""
        if self.profile is None:
            return []
        self.profile.mkdir(parents=True, exist_ok=True)
        output = str(self.profile / f"{name}.txt")
        return [
            "py-spy",
            "record",
            "-r",
            "25",
            "--format",
            "raw",
            "--gil",
            "--threads",
            "-o",
            output,
            "--",
        ]

    def _profile_server(self) -> subprocess.Popen[bytes]:
        command = [*self._profiled("server")[:-1], "--pid", str(self.server.pid)]
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# -- the node process's side --------------------------------------------------------------


def node_main(spec: dict[str, Any]) -> int:
    """``spec["count"]`` nodes, each on a thread and a connection of its own; obey stdin.

    ``next``: every node calls ``next_rendezvous()``; the process reports when
    each returned (``CLOCK_MONOTONIC``), the ranks, a digest of each
    participant list and its CPU seconds. ``departures``: the departure
    records logged here so far. ``watch``: every node also loops in
    ``wait_for_change()`` on a thread of its own, as ``tp-rdzv join`` does;
    ``changes``: how many of them saw a change. Exits when stdin closes.
    """
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    threading.stack_size(256 * 1024)
    if "switch_interval" in spec:
        sys.setswitchinterval(spec["switch_interval"])
    noted: list[Departure] = []
    watch_departures(noted.append, with_torch=spec["impl"] == "torch")
    if spec.get("count_requests"):
        from etcd_requests import count_requests

        count_requests()
    round_records: list[dict[str, Any]] = []
    steward_records = _RoundRecords(round_records.append)
    logging.getLogger("tp_rdzv_dynamic").addHandler(steward_records)
    handlers = [_make_handler(spec) for _ in range(spec["count"])]
    rounds = [threading.Semaphore(0) for _ in handlers]
    done: queue.Queue[tuple[float, Any, str | None]] = queue.Queue()

    def node(index: int) -> None:
        while True:
            rounds[index].acquire()
            try:
                info = handlers[index].next_rendezvous()
            except BaseException:
                done.put((time.monotonic(), None, traceback.format_exc()))
            else:
                done.put((time.monotonic(), info, None))

    for index in range(len(handlers)):
        threading.Thread(target=node, args=(index,), daemon=True).start()
    send_message("ready", pid=os.getpid())
    changed: list[int] = []
    for line in sys.stdin:
        command = line.strip()
        if command == "departures":
            send_message("departures", records=[departure.to_json() for departure in noted])
        elif command == "watch":
            for index, handler in enumerate(handlers):
                threading.Thread(target=_watch, args=(handler, index, changed), daemon=True).start()
            send_message("watching")
        elif command == "changes":
            send_message("changes", nodes=len(changed))
        elif command == "requests":
            from etcd_requests import take_counts

            send_message("requests", counts=take_counts())
        if command != "next":
            continue
        before = resource.getrusage(resource.RUSAGE_SELF)
        for gate in rounds:
            gate.release()
        returned = [done.get() for _ in handlers]
        # A steward of this process may still be publishing (the rest of the
        # answers, the outcome) when the nodes here have theirs: its CPU is the round's.
        steward_records.published.wait(spec["timeout"])
        usage = _usage_since(before)
        errors = [error for _, _, error in returned if error is not None]
        if errors:
            send_message("error", error=f"{len(errors)} node(s) raised; one:\n{errors[0]}")
            continue
        infos = [info for _, info, _ in returned]
        send_message(
            "joined",
            at=[at for at, _, _ in returned],
            ranks=[info.rank for info in infos],
            world_sizes=[info.world_size for info in infos],
            **usage,
            rounds=round_records,
        )
        # The participant lists are compared once every process has reported:
        # hashing them here would take CPU from the nodes still in the round.
        # Ours read them from the round's roster, once per process: one digest
        # per process (and per round) says what every node of it was told.
        if sys.stdin.readline().strip() == "digest":
            per_round = {info.world_size: info for info in infos}.values()
            send_message("digests", participants=sorted({_digest(i) for i in per_round} - {None}))
    os._exit(0)  # no shutdown: that closes the rendezvous, which is not what is measured


class _RoundRecords(logging.Handler):
    """Notes the steward's ``round_decided`` and ``round_published`` records (ours)."""

    def __init__(self, note: Callable[[dict[str, Any]], None]) -> None:
        super().__init__(logging.INFO)
        self._note = note
        #: Clear from a round's decision until it is published (set: nothing under way).
        self.published = threading.Event()
        self.published.set()

    def emit(self, record: logging.LogRecord) -> None:
        action = getattr(record, "action", None)
        if action in {"round_decided", "round_published"}:
            duration = getattr(record, "duration", 0.0)
            self._note({"action": action, "monotonic": time.monotonic(), "duration": duration})
            if action == "round_decided":
                self.published.clear()
            else:
                self.published.set()


def _watch(handler: Any, index: int, changed: list[int]) -> None:
    """Wait for a change of the round, as ``tp-rdzv join`` does; note the node if one came."""
    while not handler.wait_for_change(WATCH_SECONDS):
        pass
    changed.append(index)


def _open_store(spec: dict[str, Any], timeout: timedelta) -> Any:
    """A node's store client: an ``EtcdStore``, or ``impl``'s TCPStore."""
    if spec["store"] == "etcd":
        from tp_rdzv_api import RendezvousParameters
        from tp_rdzv_etcd.factory import create_store

        # As backend ``etcd`` of the registry (torchrun's way) makes it for the run.
        params = RendezvousParameters(
            "etcd",
            spec["endpoint"],
            spec["run_id"],
            spec["min_nodes"],
            spec["max_nodes"],
            etcd_prefix="/rdzv-bench",
            read_timeout=timeout.total_seconds(),
            transport=spec.get("transport", "auto"),
        )
        return create_store(params)
    host, port = spec["endpoint"].rsplit(":", 1)
    if spec["impl"] == "ours":
        from tp_store import TCPStore

        return TCPStore(host, int(port), timeout=timeout)
    import torch.distributed as dist

    return dist.TCPStore(host, int(port), is_master=False, timeout=timeout)


def _torch_etcd_v2(spec: dict[str, Any]) -> tuple[Any, Any]:
    """torch's ``etcd-v2`` backend and store (python-etcd, etcd's v2 API) at ``endpoint``."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend

    host_port = spec["endpoint"].split(",")[0].split("//")[-1]
    params = RendezvousParameters(
        "etcd-v2", host_port, spec["run_id"], spec["min_nodes"], spec["max_nodes"]
    )
    return create_backend(params)


def _make_handler(spec: dict[str, Any]) -> Any:
    timeout = timedelta(seconds=spec["timeout"])
    config = spec["config"]
    if spec["store"] == "etcd-v2":
        backend, store = _torch_etcd_v2(spec)
    else:
        store = _open_store(spec, timeout)
    if spec["impl"] == "ours":
        from tp_rdzv_api import RendezvousTimeout
        from tp_rdzv_dynamic import DynamicRendezvousHandler, TpRendezvousBackend

        backend: Any = TpRendezvousBackend(store, spec["run_id"])
        handler_class: Any = DynamicRendezvousHandler
        last_call = timedelta(seconds=config["last_call_timeout"])
        rdzv_timeout: Any = RendezvousTimeout(join=timeout, last_call=last_call)
    else:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )

        if spec["store"] != "etcd-v2":
            backend = C10dRendezvousBackend(store, spec["run_id"])
        handler_class = dynamic_rendezvous.DynamicRendezvousHandler
        # torch's timeouts are whole seconds (0.5 reads as 0, which it refuses).
        last_call = timedelta(seconds=max(1, round(config["last_call_timeout"])))
        rdzv_timeout = dynamic_rendezvous.RendezvousTimeout(join=timeout, last_call=last_call)
    return handler_class.from_backend(
        spec["run_id"],
        store,
        backend,
        spec["min_nodes"],
        spec["max_nodes"],
        local_addr="127.0.0.1",
        timeout=rdzv_timeout,
        keep_alive_interval=config["keep_alive_interval"],
        keep_alive_max_attempt=config["keep_alive_max_attempt"],
    )


def _digest(info: Any) -> str | None:
    participants = getattr(info, "participants", None)
    if participants is None:
        return None  # torch's RendezvousInfo carries none
    return hashlib.sha256(repr([str(p) for p in participants]).encode()).hexdigest()


def _usage_since(before: resource.struct_rusage) -> dict[str, float]:
    """This process's CPU seconds (all, and the kernel's) and context switches since
    ``before``."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    system = now.ru_stime - before.ru_stime
    return {
        "cpu": now.ru_utime - before.ru_utime + system,
        "cpu_system": system,
        "switches": now.ru_nvcsw + now.ru_nivcsw - before.ru_nvcsw - before.ru_nivcsw,
    }


if __name__ == "__main__":
    if sys.argv[1:2] != ["node"] or len(sys.argv) != 3:
        sys.exit("usage: spread.py node SPEC (rdzv_bench.py --spread runs this)")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    sys.exit(node_main(json.loads(sys.argv[2])))
