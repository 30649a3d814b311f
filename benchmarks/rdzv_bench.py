#!/usr/bin/env python3
"""Benchmark tp-rdzv-dynamic's dynamic rendezvous against PyTorch's, in one run.

"ours" is ``tp_rdzv_dynamic.DynamicRendezvousHandler`` over
``TpRendezvousBackend`` and tp_store's ``TCPStore``; "torch" is
``torch.distributed.elastic.rendezvous.dynamic_rendezvous.DynamicRendezvousHandler``
over ``C10dRendezvousBackend`` and ``torch.distributed.TCPStore``. Both are
driven by the same harness code; only the classes differ.

Scenarios:
1. a first round of N nodes (min_nodes = max_nodes = N): N threads of this
   process, each with its own handler and its own store client connection to
   one store server hosted by the harness. All threads are released at once;
   the time is from the release until the last ``next_rendezvous()`` returns.
   Every round is checked: ranks 0..N-1 once each, world size N everywhere,
   and (ours) the same participant list everywhere.
   The etcd rows run the same scenario for ours on ``tp_rdzv_etcd.EtcdStore``
   (a store client per node, against a one-member etcd cluster this bench
   starts on a free loopback port with a temporary data dir), next to ours on
   the embedded store; torch has no counterpart (its etcd backends need etcd's
   v2 API, which etcd 3.6 removed).
2. re-rendezvous after kill -9: 8 node processes made by the backend registry
   (one of them hosts the store), min 6, max 8. After the first round, two
   nodes that do not host the store are killed with SIGKILL and the six
   survivors call ``next_rendezvous()`` again; the time is from the kill until
   the last survivor returns, and the new ranks must be 0..5. The detection
   row is the time from the kill until a record of the last victim's removal
   (``departures.py``: ours, the steward's; torch, the first node's sync that
   found the victim's heartbeat expired).

Results are printed as a table (with ours/torch ratios) and written as JSON.
Run ``python benchmarks/rdzv_bench.py --help`` for the knobs.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from departures import Departure, removal_times, watch_departures
from hostinfo import host_info, load_average, versions
from metrics import Metric, format_table, write_results
from node_messages import NodeProcess, send_message
from spread import SpreadCase, SpreadResult, collect, run_spread

IMPLS = ("ours", "torch")
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "rdzv_bench.json"
# --recovery: the kill cases alone (the report's recovery section reads this file).
RECOVERY_OUT = HERE / "results" / "rdzv_recovery.json"
RECOVERY_SPREAD = "1000:8:100"
# Doubling sizes, so the report's log-log plot has a curve to show.
DEFAULT_SIZES = (8, 16, 32, 64, 128, 256, 512, 1000)
QUICK_SIZES = (8, 32)
# The first-round sizes measured on etcd as well (ours only).
ETCD_SIZES = (8, 32, 128)
# torch's round cost grows faster than linearly with the node count: on a
# 2-vCPU host 96 nodes have taken anywhere from 9 s to over 200 s, so the
# larger sizes are measured for ours only (--torch-max-nodes raises this).
TORCH_MAX_NODES = 64
# The spread cases (N nodes over P processes, the server alone; N:P:K kills K after round 1).
DEFAULT_SPREAD = ("200:4", "1000:8", "4000:16", "1000:8:100")
# torch's c10d in the spread cases up to this many nodes (--torch-spread-max raises it).
TORCH_SPREAD_MAX = 200
# Seconds allowed per round; the default sizes need far less.
DEFAULT_TIMEOUT = 300.0
# Thousands of node threads: a small stack each keeps the address space sane.
THREAD_STACK_BYTES = 256 * 1024

# The kill scenario: 8 nodes, two of them killed, 6 survivors re-rendezvous.
KILL_NODES = 8
KILL_VICTIMS = 2
KILL_MIN_NODES = KILL_NODES - KILL_VICTIMS
KILL_CONFIG = {
    "keep_alive_interval": 1,
    "keep_alive_max_attempt": 2,
    "last_call_timeout": 0.5,
    "join_timeout": 60,
}


class VerificationError(RuntimeError):
    """A round completed but its outcome is wrong."""


# -- the two implementations ---------------------------------------------------------


@dataclass(frozen=True)
class Impl:
    """The classes of one implementation. Ours mirrors torch's signatures, so
    the harness builds either side with the same calls."""

    name: str
    store: Any  # TCPStore(host, port, is_master=..., wait_for_workers=..., timeout=...)
    handler: Any  # DynamicRendezvousHandler with from_backend(...)
    backend: Any  # the rendezvous backend class: backend(store, run_id)
    timeout: Any  # RendezvousTimeout(join=..., last_call=...)
    # torch's RendezvousInfo carries no participant list; ours does.
    has_participants: bool


def load_impl(name: str) -> Impl:
    if name == "ours":
        import tp_rdzv_api
        import tp_rdzv_dynamic
        import tp_store

        return Impl(
            name,
            store=tp_store.TCPStore,
            handler=tp_rdzv_dynamic.DynamicRendezvousHandler,
            backend=tp_rdzv_dynamic.TpRendezvousBackend,
            timeout=tp_rdzv_api.RendezvousTimeout,
            has_participants=True,
        )
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )

    return Impl(
        name,
        store=dist.TCPStore,
        handler=dynamic_rendezvous.DynamicRendezvousHandler,
        backend=C10dRendezvousBackend,
        timeout=dynamic_rendezvous.RendezvousTimeout,
        has_participants=False,
    )


def close_store(store: Any) -> None:
    """Close ``store`` if it can be (ours can; torch's closes when collected)."""
    close = getattr(store, "close", None)
    if close is not None:
        close()


# -- 1. the first round of N nodes, as threads ------------------------------------------

#: node index -> a handler, ready for its first next_rendezvous()
MakeNode = Callable[[int], Any]


@dataclass
class NodeOutcome:
    """What one node thread saw."""

    info: Any = None
    returned_at: float | None = None
    error: str | None = None


@dataclass
class RoundTiming:
    """Seconds from the release of all nodes until the first and the last returned."""

    first: float
    last: float
    setup: float  # creating the handlers and their connections (before the release)
    shutdown: float = 0.0  # every node's shutdown() after the round (after the measurement)


def time_first_round(size: int, make_node: MakeNode, timeout: float, impl: Impl) -> RoundTiming:
    """Run one round of ``size`` nodes made by ``make_node``; time and verify it.

    Each node gets a thread that waits for a common start signal, calls
    ``next_rendezvous()`` once and notes when it returned; the handlers are
    shut down afterwards, one at a time. Raises ``TimeoutError`` when some
    node has not returned within ``timeout`` seconds, ``RuntimeError`` when a
    node raised and ``VerificationError`` when the outcome is wrong.
    """
    setup_started = time.perf_counter()
    handlers = [make_node(index) for index in range(size)]
    setup = time.perf_counter() - setup_started
    outcomes = [NodeOutcome() for _ in handlers]
    all_waiting = threading.Barrier(size + 1)
    start = threading.Event()
    finished = threading.Semaphore(0)  # released once per node that returned or raised

    def node(index: int) -> None:
        outcome = outcomes[index]
        all_waiting.wait()
        start.wait()
        try:
            outcome.info = handlers[index].next_rendezvous()
            outcome.returned_at = time.perf_counter()
        except BaseException:
            outcome.error = traceback.format_exc()
        finished.release()

    threads = [
        threading.Thread(target=node, args=(index,), name=f"node-{index}", daemon=True)
        for index in range(size)
    ]
    for thread in threads:
        thread.start()
    all_waiting.wait()
    # Stamp before the release: the measured time includes waking the nodes.
    started = time.perf_counter()
    start.set()
    try:
        wait_for_nodes(finished, outcomes, started + timeout)
        raise_node_errors(outcomes)
        ends = [outcome.returned_at for outcome in outcomes if outcome.returned_at is not None]
        timing = RoundTiming(first=min(ends) - started, last=max(ends) - started, setup=setup)
        # Said before the shutdown and the checks, which take long at large sizes.
        print(f"    all {size} returned after {timing.last:.2f} s; shutting down", flush=True)
    finally:
        shutdown_started = time.perf_counter()
        returned = [handlers[i] for i, outcome in enumerate(outcomes) if outcome.info is not None]
        shut_down_one_by_one(returned, deadline=time.monotonic() + min(timeout, 120))
    timing.shutdown = time.perf_counter() - shutdown_started
    # Checked once the handlers are shut down: comparing N participant lists of
    # N nodes holds the GIL long enough at thousands of nodes to starve the
    # handlers' heartbeat threads, which the checks must not disturb.
    verify_round([outcome.info for outcome in outcomes], size, impl.has_participants)
    return timing


def wait_for_nodes(
    finished: threading.Semaphore, outcomes: Sequence[NodeOutcome], deadline: float
) -> None:
    """Wait until every node returned or raised; ``TimeoutError`` at ``deadline``."""
    for _ in outcomes:
        if not finished.acquire(timeout=max(deadline - time.perf_counter(), 0)):
            pending = [
                i for i, o in enumerate(outcomes) if o.returned_at is None and o.error is None
            ]
            shown = ", ".join(map(str, pending[:10])) + (" ..." if len(pending) > 10 else "")
            raise TimeoutError(
                f"{len(pending)}/{len(outcomes)} nodes had not returned (nodes {shown}; "
                f"this process is pid {os.getpid()})"
            )


def shut_down_one_by_one(handlers: Sequence[Any], deadline: float) -> None:
    """Shut ``handlers`` down in turn until ``deadline``.

    Not all at once: every shutdown() closes the rendezvous, and thousands of
    them racing is a scenario of its own (it can take minutes and gigabytes);
    here it must not disturb the rest of the run.
    """
    for done, handler in enumerate(handlers):
        if time.monotonic() >= deadline:
            print(f"    ({len(handlers) - done} handlers left running)", file=sys.stderr)
            return
        shutdown_quietly(handler)


def shutdown_quietly(handler: Any) -> None:
    """Shut a handler down after the measurement; failures there are not the benchmark's."""
    try:
        handler.shutdown()
    except Exception as exc:
        print(f"    (shutdown failed: {type(exc).__name__}: {exc})", file=sys.stderr)


def raise_node_errors(outcomes: Sequence[NodeOutcome]) -> None:
    failed = [(index, o.error) for index, o in enumerate(outcomes) if o.error is not None]
    if failed:
        index, error = failed[0]
        raise RuntimeError(f"{len(failed)} node(s) raised; node {index}:\n{error}")


def verify_round(infos: Sequence[Any], size: int, check_participants: bool) -> None:
    """Ranks 0..size-1 once each, world size ``size``, one participant list."""
    ranks = sorted(info.rank for info in infos)
    if ranks != list(range(size)):
        raise VerificationError(f"ranks are not 0..{size - 1} once each: {ranks[:20]}")
    world_sizes = {info.world_size for info in infos}
    if world_sizes != {size}:
        raise VerificationError(f"world sizes {sorted(world_sizes)}, expected {size}")
    if not check_participants:
        return
    first = list(infos[0].participants)
    if len(first) != size or len(set(first)) != size:
        raise VerificationError(f"{len(first)} participants ({len(set(first))} distinct)")
    for info in infos[1:]:
        if info.participants != first:
            raise VerificationError(f"rank {info.rank} sees other participants than rank 0")


def first_round_on(
    impl: Impl, size: int, timeout: float, run_id: str, open_client: Callable[[], Any]
) -> RoundTiming:
    """A first round of ``size`` threaded nodes of ``impl``, each on a client of its own."""
    store_timeout = timedelta(seconds=timeout)
    clients: list[Any] = []

    def make_node(index: int) -> Any:
        client = open_client()
        clients.append(client)
        return impl.handler.from_backend(
            run_id,
            client,
            impl.backend(client, run_id),
            size,
            size,
            local_addr="127.0.0.1",
            # min == max: the round completes when the last node joins, the
            # last-call window never opens.
            timeout=impl.timeout(join=store_timeout, last_call=timedelta(seconds=1)),
            keep_alive_interval=5,
            keep_alive_max_attempt=3,
        )

    try:
        return time_first_round(size, make_node, timeout, impl)
    finally:
        for client in clients:
            close_store(client)


def bench_first_round(impl: Impl, size: int, timeout: float) -> RoundTiming:
    """A first round of ``size`` threaded nodes of ``impl`` on a fresh store server."""
    run_id = f"bench-{impl.name}-{size}-{uuid.uuid4().hex[:8]}"
    store_timeout = timedelta(seconds=timeout)
    server = impl.store(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        use_libuv=True,
        timeout=store_timeout,
    )

    def open_client() -> Any:
        return impl.store(
            "127.0.0.1", server.port, is_master=False, wait_for_workers=False, timeout=store_timeout
        )

    try:
        return first_round_on(impl, size, timeout, run_id, open_client)
    finally:
        close_store(server)


# -- 1b. the first round of N nodes on etcd (ours only) --------------------------------


def bench_first_round_etcd(size: int, timeout: float, endpoint: str) -> RoundTiming:
    """A first round of ``size`` threaded nodes of ours, each with an EtcdStore client."""
    from tp_rdzv_etcd import EtcdStore

    run_id = f"bench-etcd-{size}-{uuid.uuid4().hex[:8]}"
    return first_round_on(
        load_impl("ours"),
        size,
        timeout,
        run_id,
        lambda: EtcdStore(endpoint, f"/rdzv-bench/{run_id}/", timeout),
    )


# -- 2. re-rendezvous after kill -9, as processes -------------------------------------


def node_main(args: argparse.Namespace) -> int:
    """A node process: make a handler through the registry, then obey stdin.

    Commands, one a line: ``next`` (call next_rendezvous, report the outcome
    and when it returned on the system-wide monotonic clock), ``departures``
    (the departure records logged here so far) and ``exit``.
    """
    noted: list[Departure] = []
    watch_departures(noted.append, with_torch=args.impl == "torch")
    handler = create_registry_handler(args.impl, args.endpoint, args.run_id, args.is_host == "true")
    send_message("ready", pid=os.getpid())
    for line in sys.stdin:
        command = line.strip()
        if command == "departures":
            send_message("departures", records=[departure.to_json() for departure in noted])
        elif command == "next":
            try:
                info = handler.next_rendezvous()
            except Exception:
                send_message("error", error=traceback.format_exc())
                continue
            returned_at = time.monotonic()
            participants = getattr(info, "participants", None)
            send_message(
                "joined",
                rank=info.rank,
                world_size=info.world_size,
                participants=None if participants is None else [str(p) for p in participants],
                at=returned_at,
            )
        elif command == "exit":
            shutdown_quietly(handler)
            send_message("bye")
            break
    sys.stdout.flush()
    # Leftover non-daemon threads of a handler must not keep the process alive.
    os._exit(0)


def create_registry_handler(impl: str, endpoint: str, run_id: str, is_host: bool) -> Any:
    """A handler from ``impl``'s backend registry, configured as KILL_CONFIG says."""
    if impl == "ours":
        import tp_rdzv_api

        params = tp_rdzv_api.RendezvousParameters(
            "core",
            endpoint,
            run_id,
            KILL_MIN_NODES,
            KILL_NODES,
            local_addr="127.0.0.1",
            config={**KILL_CONFIG, "is_host": is_host},
        )
        return tp_rdzv_api.create_handler(params)
    from torch.distributed.elastic.rendezvous import (
        RendezvousParameters,
        rendezvous_handler_registry,
    )

    params = RendezvousParameters(
        "c10d",
        endpoint,
        run_id,
        KILL_MIN_NODES,
        KILL_NODES,
        local_addr="127.0.0.1",
        **torch_kill_config(),
        is_host=is_host,
    )
    return rendezvous_handler_registry.create_handler(params)


def torch_kill_config() -> dict[str, int]:
    """KILL_CONFIG for torch, whose timeouts are whole seconds (0.5 s reads as 0, invalid)."""
    return {key: math.ceil(value) for key, value in KILL_CONFIG.items()}


class NodeGroup:
    """The node processes of one kill scenario, and their messages."""

    def __init__(self, impl: str, endpoint: str, run_id: str, timeout: float) -> None:
        self.impl = impl
        self.endpoint = endpoint
        self.run_id = run_id
        self.timeout = timeout
        self.inbox: queue.Queue[tuple[int, dict]] = queue.Queue()
        self.nodes: dict[int, NodeProcess] = {}

    def start(self, slot: int, is_host: bool) -> None:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--node",
            "--impl",
            self.impl,
            "--endpoint",
            self.endpoint,
            "--run-id",
            self.run_id,
            "--is-host",
            "true" if is_host else "false",
        ]
        self.nodes[slot] = NodeProcess(slot, command, self.inbox)

    def collect(self, event: str, slots: Sequence[int]) -> dict[int, dict]:
        """The next ``event`` message of each of ``slots``; raise on errors and timeouts.

        Messages from other nodes are dropped: the only ones expected are the
        end of output of the killed nodes.
        """
        return collect(self.inbox, event, slots, time.monotonic() + self.timeout)

    def close(self) -> None:
        """Let the nodes shut down (the store host last), then kill what is left."""
        host_last = sorted(self.nodes, key=lambda slot: slot == 0)
        for slot in host_last:
            node = self.nodes[slot]
            if node.proc.poll() is None:
                try:
                    node.tell("exit")
                    node.proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            node.kill()


@dataclass
class KillResult:
    seconds: float  # from the kill until the last survivor returned
    ranks: dict[int, int]  # survivor slot -> its new rank
    detection: float | None  # from the kill until the last victim's removal was logged


def bench_kill_recovery(impl: str, timeout: float) -> KillResult:
    """Round 1 of 8 node processes, kill -9 two, time the survivors' round 2."""
    endpoint = f"127.0.0.1:{free_port()}"
    run_id = f"bench-kill-{impl}-{uuid.uuid4().hex[:8]}"
    group = NodeGroup(impl, endpoint, run_id, timeout)
    all_slots = list(range(KILL_NODES))
    try:
        # Slot 0 hosts the store; it is up before the others dial it.
        group.start(0, is_host=True)
        group.collect("ready", [0])
        for slot in all_slots[1:]:
            group.start(slot, is_host=False)
        group.collect("ready", all_slots[1:])

        for slot in all_slots:
            group.nodes[slot].tell("next")
        verify_messages(group.collect("joined", all_slots), KILL_NODES)

        victims = all_slots[-KILL_VICTIMS:]  # never slot 0, the store host
        survivors = [slot for slot in all_slots if slot not in victims]
        killed_at = time.monotonic()
        for slot in victims:
            os.kill(group.nodes[slot].proc.pid, signal.SIGKILL)
        for slot in survivors:
            group.nodes[slot].tell("next")
        joined = group.collect("joined", survivors)
        verify_messages(joined, len(survivors))
        # The nodes stamp their return on CLOCK_MONOTONIC, which is system-wide.
        seconds = max(message["at"] for message in joined.values()) - killed_at
        for slot in survivors:
            group.nodes[slot].tell("departures")
        reported = group.collect("departures", survivors)
        noted = [Departure.from_json(item) for m in reported.values() for item in m["records"]]
        removed = removal_times(noted, [group.nodes[slot].proc.pid for slot in victims], killed_at)
        detection = max(removed.values()) - killed_at if len(removed) == len(victims) else None
        return KillResult(seconds, {slot: joined[slot]["rank"] for slot in survivors}, detection)
    finally:
        group.close()


def verify_messages(joined: dict[int, dict], size: int) -> None:
    """verify_round for the outcomes reported by node processes."""
    infos = [argparse.Namespace(**message) for message in joined.values()]
    has_participants = all(info.participants is not None for info in infos)
    verify_round(infos, size, has_participants)


def free_port() -> int:
    """A port that was free a moment ago: the store host needs one before it starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- driver ---------------------------------------------------------------------------


class Recorder:
    """Fills the metrics and prints each result as it comes."""

    def __init__(self, metrics: dict[str, Metric]) -> None:
        self.metrics = metrics

    def record(self, name: str, impl: str, value: float | None, note: str, took: float) -> None:
        metric = self.metrics[name]
        setattr(metric, impl, value)
        if note:
            metric.notes[impl] = note
        shown = "-" if value is None else f"{value:,.2f}"
        print(f"  {impl:5} {name}: {shown} {metric.unit} {note} [{took:.1f} s]", flush=True)

    def measure(self, name: str, impl: str, run: Callable[[], tuple[float, str]]) -> None:
        """Run one measurement; a failure is recorded as no value plus the reason."""
        began = time.monotonic()
        try:
            value, note = run()
        except (TimeoutError, RuntimeError) as exc:  # VerificationError included
            kind = type(exc).__name__
            print(f"  {impl:5} {name}: FAILED\n{exc}", file=sys.stderr, flush=True)
            self.record(name, impl, None, f"{kind}: {str(exc).splitlines()[0]}", took_since(began))
            return
        self.record(name, impl, value, note, took_since(began))


def took_since(began: float) -> float:
    return time.monotonic() - began


def round_metric_name(size: int) -> str:
    return f"first round, {size} nodes"


KILL_METRIC = f"kill -9 {KILL_VICTIMS} of {KILL_NODES}, re-rendezvous"
KILL_DETECTION_METRIC = f"kill -9 {KILL_VICTIMS} of {KILL_NODES}, detection"


def detection_metric_name(case: SpreadCase) -> str:
    """The row of a spread kill case's detection time (its own row is the recovery)."""
    return f"{case.name}, detection"


def etcd_metric_name(size: int) -> str:
    return f"first round, {size} nodes, on etcd"


def new_metrics(
    sizes: Sequence[int],
    with_kill: bool,
    etcd_sizes: Sequence[int] = (),
    spread: Sequence[SpreadCase] = (),
) -> dict[str, Metric]:
    rows = [Metric(round_metric_name(size), "s", "lower") for size in sizes]
    for case in spread:
        rows.append(Metric(case.name, "s", "lower"))
        if case.victims:
            rows.append(Metric(detection_metric_name(case), "s", "lower"))
    rows += [Metric(etcd_metric_name(size), "s", "lower") for size in etcd_sizes]
    if with_kill:
        rows += [Metric(KILL_METRIC, "s", "lower"), Metric(KILL_DETECTION_METRIC, "s", "lower")]
    return {row.name: row for row in rows}


def run_all(args: argparse.Namespace, sizes: Sequence[int], recorder: Recorder) -> None:
    impls = {name: load_impl(name) for name in args.impls}
    # Sizes outer, implementations inner: both sides of a row are measured
    # minutes apart at most, under the same background noise.
    for size in sizes:
        for impl in impls.values():
            name = round_metric_name(size)
            if impl.name == "torch" and size > args.torch_max_nodes:
                recorder.record(name, impl.name, None, "skipped (ours only)", 0.0)
                continue

            def first_round(impl: Impl = impl, size: int = size) -> tuple[float, str]:
                timing = bench_first_round(impl, size, args.timeout)
                note = (
                    f"(first return {timing.first:.2f} s, setup {timing.setup:.1f} s, "
                    f"shutdown {timing.shutdown:.1f} s)"
                )
                return timing.last, note

            recorder.measure(name, impl.name, first_round)
    run_spread_cases(args, recorder)
    if args.etcd_sizes:
        run_etcd(args, recorder)
    if args.no_kill:
        return
    for impl in impls:

        def kill_recovery(impl: str = impl) -> tuple[float, str]:
            began = time.monotonic()
            result = bench_kill_recovery(impl, args.timeout)
            ranks = ",".join(str(result.ranks[slot]) for slot in sorted(result.ranks))
            note = f"(new ranks by slot {ranks})"
            if impl == "torch":
                note += f" (torch config {torch_kill_config()})"
            recorder.record(KILL_DETECTION_METRIC, impl, result.detection, "", took_since(began))
            return result.seconds, note

        recorder.measure(KILL_METRIC, impl, kill_recovery)


def run_spread_cases(args: argparse.Namespace, recorder: Recorder) -> None:
    """The spread rows, ours and torch back to back; every node's return kept for the plot."""
    for case in args.spread:
        for impl in args.impls:
            if impl == "torch" and case.nodes > args.torch_spread_max:
                recorder.record(case.name, impl, None, "skipped (ours only)", 0.0)
                continue

            def spread(impl: str = impl, case: SpreadCase = case) -> tuple[float, str]:
                run_id = f"bench-spread-{impl}-{uuid.uuid4().hex[:8]}"
                began = time.monotonic()
                result = run_spread(impl, case, args.timeout, run_id, args.profile)
                runs = args.spread_results.setdefault(case.name, {}).setdefault(impl, [])
                runs.append(result.to_json())
                if case.victims:
                    note = f"({result.detected} of {case.victims} victims' removals logged)"
                    name = detection_metric_name(case)
                    recorder.record(name, impl, result.detection, note, took_since(began))
                return spread_value(result), spread_note(result)

            recorder.measure(case.name, impl, spread)


def spread_value(result: SpreadResult) -> float:
    """The figure of a spread row: the last return, or in the kill case the recovery."""
    return result.last if result.recovery is None else result.recovery


def spread_note(result: SpreadResult) -> str:
    ops = sum(result.ops.values())
    return (
        f"(first return {result.first:.2f} s, last {result.last:.2f} s, server CPU "
        f"{result.server_cpu:.2f} s, node processes' CPU {result.nodes_cpu:.1f} s"
        + (f", {ops:,} server requests" if ops else "")
        + f", load {result.load})"
    )


def run_etcd(args: argparse.Namespace, recorder: Recorder) -> None:
    """The etcd rows: ours on a one-member etcd started here (torch has no v3 backend)."""
    # Imported here: without tp-rdzv-etcd the bench still runs, minus these rows.
    try:
        from tp_rdzv_etcd.local import LocalEtcd, etcd_version, find_etcd
    except ImportError:
        binary, missing = None, "skipped: tp-rdzv-etcd is not installed"
    else:
        binary, missing = find_etcd(args.etcd_binary), "skipped: no etcd binary"
    for size in args.etcd_sizes:
        name = etcd_metric_name(size)
        recorder.record(name, "torch", None, "no counterpart (torch's etcd needs the v2 API)", 0.0)
        if binary is None:
            recorder.record(name, "ours", None, missing, 0.0)
    if binary is None:
        return
    args.etcd_version = etcd_version(binary)
    with LocalEtcd(binary=binary) as etcd:
        for size in args.etcd_sizes:

            def first_round(size: int = size) -> tuple[float, str]:
                timing = bench_first_round_etcd(size, args.timeout, etcd.endpoints)
                note = (
                    f"(etcd {args.etcd_version}, first return {timing.first:.2f} s, "
                    f"setup {timing.setup:.1f} s, shutdown {timing.shutdown:.1f} s)"
                )
                return timing.last, note

            recorder.measure(etcd_metric_name(size), "ours", first_round)


def raise_limits() -> None:
    """Thousands of node threads, each with a client socket and its server side."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(THREAD_STACK_BYTES)


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes wants numbers like 8,32,96: {text!r}") from None
    if sizes and min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sizes wants positive numbers: {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        help="node counts of the first-round scenario, e.g. 8,32, '' for none "
        f"(default {','.join(map(str, DEFAULT_SIZES))})",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"sizes {QUICK_SIZES} only, for smoke tests"
    )
    parser.add_argument("--only", choices=IMPLS, help="run one implementation only")
    parser.add_argument(
        "--torch-max-nodes",
        type=int,
        default=TORCH_MAX_NODES,
        help="larger rounds are measured for ours only (default %(default)s)",
    )
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 scenario")
    parser.add_argument(
        "--spread",
        type=lambda text: [SpreadCase.parse(part) for part in text.split(",") if part],
        help="spread cases N:P (N nodes over P processes, the server alone) or N:P:K "
        f"(K of them killed after round 1); '' for none (default {','.join(DEFAULT_SPREAD)})",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="run the spread cases' node processes and server under py-spy, stacks in this dir",
    )
    parser.add_argument(
        "--torch-spread-max",
        type=int,
        default=TORCH_SPREAD_MAX,
        help="torch's spread rows up to this many nodes (default %(default)s)",
    )
    parser.add_argument(
        "--etcd-sizes",
        type=parse_sizes,
        default=ETCD_SIZES,
        help="first-round sizes measured on etcd too, ours only "
        f"(default {','.join(map(str, ETCD_SIZES))})",
    )
    parser.add_argument("--no-etcd", action="store_true", help="skip the etcd rows")
    parser.add_argument(
        "--etcd-binary",
        help="the etcd server binary (default: $TP_ETCD_BINARY, etcd on PATH, /usr/bin/etcd)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds allowed per round (join timeout too; default %(default)s)",
    )
    parser.add_argument(
        "--recovery",
        action="store_true",
        help=f"the kill cases alone: --sizes '' --no-etcd --spread {RECOVERY_SPREAD}, "
        f"JSON to {RECOVERY_OUT.relative_to(HERE.parent)} unless --json says otherwise",
    )
    parser.add_argument("--json", type=Path, help=f"JSON results path (default {DEFAULT_OUT})")
    # The node-process mode of the kill scenario.
    parser.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--impl", choices=IMPLS, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--run-id", help=argparse.SUPPRESS)
    parser.add_argument("--is-host", choices=("true", "false"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.recovery:
        args.sizes, args.no_etcd, args.no_kill = (), True, False
        args.spread = [SpreadCase.parse(RECOVERY_SPREAD)]
    if args.json is None:
        args.json = RECOVERY_OUT if args.recovery else DEFAULT_OUT
    args.impls = [args.only] if args.only else list(IMPLS)
    if args.spread is None:
        args.spread = [] if args.quick else [SpreadCase.parse(text) for text in DEFAULT_SPREAD]
    args.spread_results = {}
    if args.no_etcd or "ours" not in args.impls:
        args.etcd_sizes = ()
    args.etcd_version = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # children inherit it
    args = parse_args(argv)
    if args.node:
        return node_main(args)
    raise_limits()
    sizes = args.sizes if args.sizes is not None else QUICK_SIZES if args.quick else DEFAULT_SIZES
    metrics = new_metrics(
        sizes, with_kill=not args.no_kill, etcd_sizes=args.etcd_sizes, spread=args.spread
    )
    host = host_info()
    started = time.monotonic()
    print(f"running {', '.join(args.impls)} ...", flush=True)
    run_all(args, sizes, Recorder(metrics))
    print()
    print(format_table(list(metrics.values())))

    report = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": host | {"load_average_at_end": load_average()},
        "versions": versions(args.impls) | {"etcd": args.etcd_version or "not run"},
        "quick": args.quick,
        "config": {
            "sizes": list(sizes),
            "torch_max_nodes": args.torch_max_nodes,
            "timeout": args.timeout,
            "kill": {"nodes": KILL_NODES, "victims": KILL_VICTIMS, "config": KILL_CONFIG},
            "etcd": {"sizes": list(args.etcd_sizes), "version": args.etcd_version},
            "spread": [case.name for case in args.spread],
        },
        "spread": args.spread_results,
        "seconds": round(time.monotonic() - started, 1),
        "metrics": [m.to_json() for m in metrics.values()],
    }
    print()
    write_results(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
