"""Chaos trials for the dynamic rendezvous: real processes, real ``kill -9`` and ``SIGSTOP``.

One trial starts a store host (a dedicated ``python -m tp_store`` process, or
node 0 hosting the store in-process), then N node processes
(``dynamic_node.py`` of tp-rdzv-dynamic's tests) with fast liveness settings,
drives them into one phase of a round and kills one or more of them with
``SIGKILL`` there -- or kills the store host:

=============  ============================================================
``joining``    victims die inside ``next_rendezvous()`` before round 0
               completes (right after they became present, or a little
               later)
``last_call``  victims die while round 0 has ``min_nodes`` and runs its
               last-call timer
``complete``   victims die right after round 0 completed (after the first
               or after every answer)
``heartbeat``  victims die while everyone keeps alive in round 1
``closing``    a node's ``set_closed()`` is in flight when it (or another
               node) is killed
=============  ============================================================

One trial in five pauses its victims (``SIGSTOP``) in that phase instead of
killing them, often the node holding the steward lease:

=============  ============================================================
``short``      the pause (1 s) is a quarter of the liveness bound or less;
               then ``SIGCONT``. Nobody may remove a victim: no steward
               logs its departure, its presence session never ended, it is
               present at the end and in the final round, and a paused
               steward still holds the lease.
``long``       the victims stay frozen until the others have re-formed
               without them (their sessions ended: they were removed); then
               ``SIGCONT``, and every node, the victims too, must re-form
               together. A resumed steward must decide nothing: the
               split-brain check covers its log.
=============  ============================================================

The survivors then behave like agents: each re-joins (``next``) whenever the
round it got names a dead node or misses a live one, or another survivor holds
a newer round, until every survivor holds the same round. A trial passes when
it ends in an outcome its plan allows:

- ``reformed``: every survivor holds the same participant list, the ranks are
  0..n-1 once each, the killed nodes are absent and every survivor is in;
- ``connection-error``: every survivor got ``RendezvousConnectionError`` (the
  store host was killed);
- ``closed``: every survivor got ``RendezvousClosedError`` (closing trials).

Independently of the outcome, it must show no split brain: the steward of
every node logs ``round_complete`` with a digest of the committed membership
(JSON lines, one file per node, read after the trial). Two digests for one
round, two nodes told different participant lists for one round, a node told
a list whose digest differs from the committed one, or (store alive) a
survivor's list differing from the published roster ``tp_rdzv/<run>/roster/
<round>`` each count as a split brain.

Everything a trial does follows from its seed and index
(:func:`plan_trial`), so ``TP_CHAOS_SEED=<seed> TP_CHAOS_ONLY=<index>``
replays the plan of one trial (timing on a real machine still varies).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dynamic_node import NodeProcess

from tp_rdzv_dynamic.documents.answers import decode_roster
from tp_rdzv_dynamic.events import participants_digest
from tp_store import StoreError, TCPStore

PHASES = ("joining", "last_call", "complete", "heartbeat", "closing")
TOPOLOGIES = ("dedicated", "hosted")
PAUSES = ("short", "long")
ADDR = "127.0.0.1"
#: The trials of one CI run (``TP_CHAOS_TRIALS`` overrides).
CI_TRIALS = 50
#: Trials run at once (``TP_CHAOS_PARALLEL`` overrides); each is a handful of processes.
CI_PARALLEL = 2
#: How long the survivors may take to end in an outcome after the kill.
SETTLE_TIMEOUT = 40.0
#: Store operations of nodes and of the controller fail after this long (seconds).
READ_TIMEOUT = 3.0
#: The close timeout: how long a node waits for another's closing before recording it.
CLOSE_TIMEOUT = 2.0
#: Far beyond any trial: a join that times out is a hang, reported as such.
JOIN_TIMEOUT = 30.0
#: How long a short pause freezes its victims (seconds): issue 25's figure.
SHORT_PAUSE = 1.0
#: keep_alive_max_attempt of short-pause trials: a bound of 4 s or more (ka 0.2 or 0.3 s).
SHORT_PAUSE_ATTEMPTS = 20
LISTENING = re.compile(r"^listening on (?P<host>[^\s]+):(?P<port>\d+)$")

#: Lines for the pytest session's summary (the figures), even when the run passes.
SUMMARY: list[str] = []

OUTCOME_REFORMED = "reformed"
OUTCOME_CONNECTION = "connection-error"
OUTCOME_CLOSED = "closed"


@dataclasses.dataclass(frozen=True)
class TrialPlan:
    """What one trial does; a pure function of ``(seed, index)``."""

    seed: int
    index: int
    phase: str
    topology: str
    nodes: int
    #: Indexes of the nodes to kill (never node 0 when it hosts the store,
    #: unless the store host is the one to die).
    victims: tuple[int, ...]
    kill_store: bool
    #: Replace a victim by whichever node holds the steward lease at the kill (or pause).
    kill_steward: bool
    min_nodes: int
    max_nodes: int
    keep_alive_interval: float
    #: With the interval, the liveness bound: a presence session's timeout.
    keep_alive_max_attempt: int
    last_call: float
    #: Fraction of the phase's window to wait before the kill.
    delay: float
    #: Phase variant: joining -> victims post first; complete -> kill after
    #: every answer; heartbeat -> a cascade (see :attr:`cascade`); closing ->
    #: the closer is a victim.
    variant: bool
    #: ``""`` (the victims are killed), ``"short"`` or ``"long"`` (they are paused).
    pause: str = ""
    #: How long a short pause lasts (a long one lasts until the others re-formed).
    pause_seconds: float = 0.0

    @property
    def liveness_bound(self) -> float:
        """Seconds of silence after which the store ends a node's session."""
        return self.keep_alive_interval * self.keep_alive_max_attempt

    @property
    def cascade(self) -> bool:
        """Heartbeat trials that kill the victims, await their removal, then the steward.

        The steward's successor then starts from a completed round that lost
        participants (ranks with holes), which simultaneous kills never leave.
        """
        return self.phase == "heartbeat" and self.variant and not self.kill_store

    @property
    def trial_seed(self) -> int:
        """The seed of this trial's generator."""
        return self.seed * 100_003 + self.index

    def allowed(self) -> frozenset[str]:
        """The outcomes this trial may end in."""
        if self.kill_store:
            return frozenset({OUTCOME_CONNECTION})
        if self.phase == "closing":
            return frozenset({OUTCOME_CLOSED})
        return frozenset({OUTCOME_REFORMED})

    def describe(self) -> str:
        """One line for reports."""
        store = " +store" if self.kill_store else ""
        steward = " +steward" if self.kill_steward else ""
        pause = ""
        if self.pause == "short":
            pause = f" pause={self.pause_seconds:g}s"
        elif self.pause:
            pause = " pause=long"
        return (
            f"#{self.index} {self.phase}/{self.topology}{pause}{store}{steward} N={self.nodes} "
            f"victims={list(self.victims)} min={self.min_nodes} max={self.max_nodes} "
            f"ka={self.keep_alive_interval}x{self.keep_alive_max_attempt} lc={self.last_call} "
            f"delay={self.delay:.2f}{' variant' if self.variant else ''}"
        )


def plan_trial(seed: int, index: int) -> TrialPlan:
    """The plan of trial ``index`` of the run seeded ``seed``.

    Phase, topology, store kills and pauses cycle with the index so that any
    50 consecutive trials cover every phase in both topologies, with and
    without the store dying, and paused (short and long) instead of killed;
    the rest is drawn from the trial's own generator.
    """
    phase = PHASES[index % len(PHASES)]
    topology = TOPOLOGIES[(index // len(PHASES)) % len(TOPOLOGIES)]
    block = (index // (len(PHASES) * len(TOPOLOGIES))) % 5
    kill_store = block == 2
    # One block in five pauses instead of killing: short and long alternate, so
    # each phase gets both (one in each topology).
    pause = ("long" if index % 2 == 0 else "short") if block == 4 else ""
    rng = random.Random(seed * 100_003 + index)
    nodes = rng.choice((4, 4, 5, 5, 6))
    victim_count = rng.choice((1, 1, 2)) if nodes > 4 else 1
    # Node 0 hosts the store in the hosted topology: killing it is a store kill.
    eligible = list(range(1, nodes)) if topology == "hosted" else list(range(nodes))
    victims = tuple(sorted(rng.sample(eligible, victim_count)))
    if kill_store and topology == "hosted":
        victims = tuple(sorted({0, *victims[: victim_count - 1]}))
    variant = rng.random() < 0.5
    if phase == "heartbeat":
        # Cascades by the index, so that every 50 trials hold some.
        variant = block % 2 == 1
    cascade = phase == "heartbeat" and variant and not kill_store
    # A cascade kills the steward too, after the planned victims.
    survivors = nodes - len(victims) - cascade
    min_nodes = max(1, survivors - rng.choice((0, 0, 1)))
    # Joining and last-call trials need room for the last call: max is never reached.
    max_nodes = nodes + 1 if phase in ("joining", "last_call") else nodes
    kill_steward = cascade or (not kill_store and rng.random() < 0.4)
    if pause:
        # Most pauses freeze the steward, in both kinds (by the index, so every 50 do).
        kill_steward = (index // 2) % 2 == 0
    keep_alive_interval = rng.choice((0.2, 0.3))
    return TrialPlan(
        seed=seed,
        index=index,
        phase=phase,
        topology=topology,
        nodes=nodes,
        victims=victims,
        kill_store=kill_store,
        kill_steward=kill_steward,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        keep_alive_interval=keep_alive_interval,
        # A short pause lasts a quarter of the bound at most: a loaded machine
        # delaying a ping by the rest must not end the session.
        keep_alive_max_attempt=SHORT_PAUSE_ATTEMPTS if pause == "short" else 2,
        last_call=rng.choice((0.3, 0.4, 0.5)),
        delay=rng.random(),
        variant=variant,
        pause=pause,
        pause_seconds=SHORT_PAUSE if pause == "short" else 0.0,
    )


@dataclasses.dataclass
class TrialResult:
    """What a trial ended in, and what its checks found."""

    plan: TrialPlan
    outcome: str = "unknown"
    problems: list[str] = dataclasses.field(default_factory=list)
    split_brains: list[str] = dataclasses.field(default_factory=list)
    #: Where the kill (or pause) landed: the round had completed already, or not yet.
    kill_landed: str = ""
    steward_killed: bool = False
    steward_paused: bool = False
    #: Node processes killed (the planned victims, plus the steward of a cascade).
    nodes_killed: int = 0
    nodes_paused: int = 0
    #: For kills after completion with a live steward: whether it marked the round stale.
    stale_marked: bool | None = None
    rounds_committed: int = 0
    answers: int = 0
    elapsed: float = 0.0
    log_dir: str = ""

    @property
    def passed(self) -> bool:
        """Allowed outcome, no split brain, nothing else wrong."""
        return self.outcome in self.plan.allowed() and not self.split_brains and not self.problems

    def describe(self) -> str:
        """A report line, with the problems found."""
        verdict = "ok" if self.passed else "FAILED"
        strike = "pause" if self.plan.pause else "kill"
        lines = [
            f"{verdict} {self.plan.describe()} -> {self.outcome} in {self.elapsed:.1f} s"
            f" ({strike} {self.kill_landed or '-'}"
            f"{', steward killed' if self.steward_killed else ''}"
            f"{', steward paused' if self.steward_paused else ''})"
        ]
        lines += [f"    split brain: {text}" for text in self.split_brains]
        lines += [f"    problem: {text}" for text in self.problems]
        if not self.passed:
            lines.append(
                f"    replay: TP_CHAOS_SEED={self.plan.seed} TP_CHAOS_ONLY={self.plan.index}"
                f"; logs in {self.log_dir}"
            )
        return "\n".join(lines)


class StoreHost:
    """A dedicated ``python -m tp_store`` server on an ephemeral loopback port."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tp_store", "--host", ADDR, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        match = LISTENING.match(line)
        if match is None:
            self.kill()
            raise RuntimeError(f"the store server did not start: banner {line!r}")
        self.port = int(match["port"])

    def kill(self) -> None:
        """``kill -9`` the server and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((ADDR, 0))
        port: int = sock.getsockname()[1]
        return port


def node_id(node: NodeProcess) -> str:
    """``str()`` of the node's descriptor: one handler per process, so local id 0."""
    return f"{ADDR}_{node.pid}_0"


def read_log(path: Path) -> list[dict[str, Any]]:
    """The JSON records of one node's log; a line cut by ``SIGKILL`` is skipped."""
    records: list[dict[str, Any]] = []
    if not path.exists():
        return records
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def find_split_brains(
    run_id: str,
    records: Iterable[dict[str, Any]],
    answers: Iterable[tuple[str, dict[str, Any]]],
) -> tuple[list[str], int]:
    """Every sign of two memberships for one round; and how many rounds were committed.

    ``records`` are log records of every node (only ``round_complete`` of
    ``run_id`` count); ``answers`` are ``(node name, answer)`` pairs of every
    successful ``next`` any node gave, killed ones included.
    """
    committed: dict[int, set[str]] = defaultdict(set)
    found: list[str] = []
    for record in records:
        if record.get("action") == "round_complete" and record.get("run_id") == run_id:
            digest = record.get("participants_digest")
            if not isinstance(digest, str) or not isinstance(record.get("round"), int):
                # Without the digest nothing can be compared: a steward that
                # does not log it (an older tp-rdzv-dynamic) fails the check.
                found.append(f"a round_complete record without round or digest: {record}")
                continue
            committed[record["round"]].add(digest)
    found += [
        f"round {round_} was committed with {len(digests)} memberships: {sorted(digests)}"
        for round_, digests in sorted(committed.items())
        if len(digests) > 1
    ]
    seen: dict[int, dict[tuple[str, ...], list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, answer in answers:
        round_ = answer.get("round")
        if not isinstance(round_, int):
            found.append(f"{name} answered a round without its number: {answer}")
            continue
        seen[round_][tuple(answer["participants"])].append(name)
    for round_, lists in sorted(seen.items()):
        if len(lists) > 1:
            found.append(
                f"round {round_}: nodes were told different participants: "
                + "; ".join(f"{names} got {list(members)}" for members, names in lists.items())
            )
        for members, names in lists.items():
            digest = participants_digest(members)
            if committed.get(round_) and digest not in committed[round_]:
                found.append(
                    f"round {round_}: {names} got {list(members)} (digest {digest}) but the "
                    f"steward committed {sorted(committed[round_])}"
                )
    return found, len(committed)


def short_pause_removals(
    run_id: str, records: Iterable[dict[str, Any]], victims: dict[int, str], until: float
) -> list[str]:
    """Every sign in the logs that a victim of a short pause was taken for gone.

    ``victims`` maps their pids to their names. A sign is a steward's
    ``node_gone`` (its session ended) or ``node_dead`` (its counter stopped)
    naming one, or a victim's own ``presence_lost`` (it found its session
    ended and opened a new one), logged before ``until`` (wall clock: the
    trial's end, where every node leaves and the steward sees them go).
    """
    ids = {f"{ADDR}_{pid}_0": name for pid, name in victims.items()}
    pids = victims
    found = []
    for record in records:
        if record.get("run_id") != run_id or not record.get("time", until) < until:
            continue
        action = record.get("action")
        if action in ("node_gone", "node_dead") and record.get("node") in ids:
            found.append(
                f"{ids[record['node']]} was removed in a short pause: {record.get('message')}"
            )
        elif action == "presence_lost" and record.get("pid") in pids:
            found.append(f"{pids[record['pid']]}'s session ended in a short pause")
    return found


class Trial:
    """One trial, run by :meth:`run` (which never raises: problems are recorded)."""

    def __init__(self, plan: TrialPlan, workdir: Path) -> None:
        self.plan = plan
        self.workdir = workdir
        self.run_id = f"chaos-{plan.index}-{uuid.uuid4().hex[:8]}"
        self.result = TrialResult(plan, log_dir=str(workdir))
        self.nodes: list[NodeProcess] = []
        self.killed: list[NodeProcess] = []
        #: Victims frozen now (a long pause until the others re-formed).
        self.paused: list[NodeProcess] = []
        #: Victims paused and resumed, and the monotonic time of their resumption.
        self.resumed: list[NodeProcess] = []
        self.resumed_at = 0.0
        #: Wall-clock time when the trial began to stop its nodes (their logs' clock).
        self.ended_at = 0.0
        #: Resumed victims that still owe a ``next`` of their own (see ``rejoin_if_needed``).
        self.rejoin_after_resume: set[str] = set()
        #: Commands sent to each node and not answered yet.
        self.unanswered: Counter[str] = Counter()
        self.store_host: StoreHost | None = None
        self.store_dead = False
        self.port = 0
        self.client: TCPStore | None = None
        #: Every successful ``next`` answer of every node: the split-brain evidence.
        self.history: list[tuple[str, dict[str, Any]]] = []
        self.latest: dict[str, dict[str, Any]] = {}
        #: The node whose set_closed() is in flight at the kill (closing trials).
        self.closer: NodeProcess | None = None

    # -- set-up -------------------------------------------------------------------
    def spec(self, index: int) -> dict[str, Any]:
        plan = self.plan
        config: dict[str, Any] = {
            "join_timeout": JOIN_TIMEOUT,
            "read_timeout": READ_TIMEOUT,
            "close_timeout": CLOSE_TIMEOUT,
            "keep_alive_interval": plan.keep_alive_interval,
            "keep_alive_max_attempt": plan.keep_alive_max_attempt,
            "last_call_timeout": plan.last_call,
            "is_host": plan.topology == "hosted" and index == 0,
        }
        return {
            "backend": "core",
            "endpoint": f"{ADDR}:{self.port}",
            "run_id": self.run_id,
            "min_nodes": plan.min_nodes,
            "max_nodes": plan.max_nodes,
            "local_addr": ADDR,
            "config": config,
            "log_level": "INFO",
            "log_format": "json",
            "log_file": str(self.workdir / f"n{index}.jsonl"),
        }

    def start(self) -> None:
        if self.plan.topology == "dedicated":
            self.store_host = StoreHost()
            self.port = self.store_host.port
        else:
            self.port = _free_port()
        names = [f"n{i}" for i in range(self.plan.nodes)]
        if self.plan.topology == "hosted":
            # The host's server must listen before anyone connects.
            host = NodeProcess(names[0], self.spec(0))
            self.nodes.append(host)
            host.wait_ready()
        rest = [
            NodeProcess(name, self.spec(i)) for i, name in enumerate(names) if i >= len(self.nodes)
        ]
        self.nodes += rest
        for node in rest:
            node.wait_ready()
        self.client = TCPStore(ADDR, self.port, timeout=READ_TIMEOUT)

    def key(self, name: str) -> str:
        return f"tp_rdzv/{self.run_id}/{name}"

    # -- watching the store ---------------------------------------------------------
    def store_call(self, what: str, call: Any) -> Any:
        """``call(client)``, or ``None`` with a problem noted if the store failed unexpectedly."""
        assert self.client is not None
        try:
            return call(self.client)
        except StoreError as exc:
            if not self.store_dead:
                self.result.problems.append(f"the controller's store call failed ({what}): {exc}")
            return None

    def steward_pid(self) -> int | None:
        raw = self.store_call(
            "reading the lease", lambda s: s.compare_set(self.key("steward"), "", "")
        )
        if not raw:
            return None
        parts = raw.decode(errors="replace").split(" ")
        if len(parts) != 4 or parts[1] == "-":
            return None
        match = re.fullmatch(rf"{re.escape(ADDR)}_(\d+)_\d+", parts[1])
        return int(match.group(1)) if match else None

    def round_completed(self, round_: int) -> bool:
        key = self.key(f"result/{round_}")
        return bool(self.store_call("checking an outcome", lambda s: s.check([key])))

    def await_present(self, nodes: Sequence[NodeProcess], timeout: float) -> None:
        """Until every one of ``nodes`` is present through its store session (the
        stores here offer sessions): it is inside ``next_rendezvous()``."""
        keys = [self.key(f"present/{node_id(node)}") for node in nodes]
        self.store_call("waiting for the nodes' presence", lambda s: s.wait(keys, timeout))

    def await_pending(self, count: int, timeout: float) -> bool:
        """Until the steward reports ``count`` nodes gathered in the open round."""
        deadline = time.monotonic() + timeout
        key = self.key("pending")
        while time.monotonic() < deadline:
            gathered = self.store_call("reading the open round", lambda s: s.add(key, 0))
            if gathered is None:
                return False
            if gathered >= count:
                return True
            # The counter has no change notification; it moves at least once per tick.
            time.sleep(0.01)
        return False

    # -- driving nodes ----------------------------------------------------------------
    def send(self, nodes: Iterable[NodeProcess], command: str) -> None:
        for node in nodes:
            node.send(command)
            self.unanswered[node.name] += 1

    def take(self, node: NodeProcess, answer: dict[str, Any]) -> None:
        self.result.answers += 1
        self.unanswered[node.name] -= 1
        if answer.get("cmd") == "next" and "error" not in answer:
            self.history.append((node.name, answer))
        self.latest[node.name] = answer

    def collect(self, nodes: Sequence[NodeProcess], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for node in nodes:
            self.take(node, node.read(max(deadline - time.monotonic(), 0.01), "an answer"))

    def first_answer(self, nodes: Sequence[NodeProcess], timeout: float) -> list[NodeProcess]:
        """Wait for any of ``nodes`` to answer; the ones that answered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = []
            for node in nodes:
                answer = node.poll(0.005)
                if answer is not None:
                    self.take(node, answer)
                    got.append(node)
            if got:
                return got
        raise AssertionError(f"no node answered within {timeout:g} s")

    def pick_victims(self) -> list[NodeProcess]:
        plan = self.plan
        victims = [self.nodes[i] for i in plan.victims]
        if plan.kill_steward:
            pid = self.steward_pid()
            protected = self.nodes[0] if plan.topology == "hosted" else None
            steward = next((n for n in self.nodes if n.pid == pid), None)
            if steward is not None and steward is not protected and steward not in victims:
                victims[-1] = steward
        return victims

    def kill(self, victims: Sequence[NodeProcess], round_: int) -> None:
        """SIGKILL ``victims`` (and the store host if planned), or pause them if the
        plan says so; note where the kill landed."""
        self.result.kill_landed = (
            "after completion" if self.round_completed(round_) else "before completion"
        )
        pid = self.steward_pid()
        if self.plan.pause:
            self.pause(victims, pid)
            return
        if self.plan.kill_store:
            self.store_dead = True
            if self.store_host is not None:
                self.store_host.kill()
        for victim in victims:
            victim.kill()
            self.killed.append(victim)
            self.result.nodes_killed += 1
            if victim.pid == pid:
                self.result.steward_killed = True

    def pause(self, victims: Sequence[NodeProcess], steward_pid: int | None) -> None:
        """SIGSTOP ``victims``; a short pause ends after ``pause_seconds``, a long one
        when the others have re-formed (:meth:`run`)."""
        for victim in victims:
            victim.pause()
            self.paused.append(victim)
            self.result.nodes_paused += 1
            if victim.pid == steward_pid:
                self.result.steward_paused = True
        if self.plan.pause == "short":
            # The pause itself is the stimulus: nothing is judged by its length.
            self.dwell(self.plan.pause_seconds)
            self.resume()

    def resume(self) -> None:
        """SIGCONT the paused victims.

        After a long pause they rejoin: their peers went on without them. After a
        short one they hold what they held: nobody should have moved on.
        """
        for victim in self.paused:
            victim.resume()
            self.resumed.append(victim)
            if self.plan.pause == "long":
                self.rejoin_after_resume.add(victim.name)
        self.resumed_at = time.monotonic()
        self.paused = []

    def survivors(self) -> list[NodeProcess]:
        """The nodes that take part now: neither killed nor frozen."""
        return [node for node in self.nodes if node not in self.killed + self.paused]

    def dwell(self, seconds: float) -> None:
        """Let the phase run for ``seconds``: the time of the kill is what a trial varies."""
        time.sleep(max(seconds, 0.0))

    # -- the phases ---------------------------------------------------------------------
    def phase_joining(self) -> None:
        plan = self.plan
        victims = [self.nodes[i] for i in plan.victims]
        others = [node for node in self.nodes if node not in victims]
        # Victims first: the first of them likely takes the steward lease.
        order = [*victims, *others] if plan.variant else [*others, *victims]
        self.send(order, "next")
        self.await_present(victims, READ_TIMEOUT)
        self.dwell(plan.delay * plan.last_call * 0.6)
        self.kill(self.pick_victims(), 0)

    def phase_last_call(self) -> None:
        plan = self.plan
        self.send(self.nodes, "next")
        if not self.await_pending(plan.min_nodes, 10.0):
            self.result.problems.append(f"round 0 never gathered {plan.min_nodes} nodes")
        self.dwell(plan.delay * plan.last_call * 0.7)
        self.kill(self.pick_victims(), 0)

    def phase_complete(self) -> None:
        self.send(self.nodes, "next")
        if self.plan.variant:
            self.collect(self.nodes, 20.0)
        else:
            self.first_answer(self.nodes, 20.0)
        self.kill(self.pick_victims(), 0)
        self.watch_stale(0)

    def phase_heartbeat(self) -> None:
        self.send(self.nodes, "next")
        self.collect(self.nodes, 20.0)
        # Every node re-joins: round 1, everyone heartbeating in it.
        self.send(self.nodes, "next")
        self.collect(self.nodes, 20.0)
        self.dwell(self.plan.keep_alive_interval * (0.5 + 3 * self.plan.delay))
        if not self.plan.cascade:
            self.kill(self.pick_victims(), 1)
            self.watch_stale(1)
            return
        pid = self.steward_pid()
        steward = next((node for node in self.nodes if node.pid == pid), None)
        protected = self.nodes[0] if self.plan.topology == "hosted" else None
        planned = [self.nodes[i] for i in self.plan.victims]
        first = [node for node in planned if node is not steward]
        if len(first) < len(planned):
            # The steward was planned: another node dies first in its place
            # (the plan left room for one more death).
            first.append(
                next(n for n in self.nodes if n not in (steward, protected) and n not in planned)
            )
        self.kill(first, 1)
        # The live steward removes them and persists the completed round without them...
        self.watch_stale(1)
        if steward is not None and steward is not protected:
            # ...then it dies: its successor loads that state.
            self.kill([steward], 1)

    def phase_closing(self) -> None:
        plan = self.plan
        self.send(self.nodes, "next")
        self.collect(self.nodes, 20.0)
        victims = self.pick_victims()
        protected = self.nodes[0] if plan.topology == "hosted" and not plan.kill_store else None
        candidates = [n for n in victims if n is not protected]
        if plan.variant and candidates:
            self.closer = candidates[0]
        else:
            self.closer = next(n for n in self.nodes if n not in victims)
        self.send([self.closer], "close")
        # set_closed() takes a few store round trips: the kill lands inside it, or just after.
        self.dwell(plan.delay * 0.03)
        self.kill(victims, 0)

    def watch_stale(self, round_: int) -> None:
        """After killing participants of a completed round, it must be marked stale.

        ``wait_for_change()`` promises it when a participant dies. Only a live
        steward marks it: the nodes here only heartbeat (none is in
        ``wait_for_change()``, which would take a silent steward's lease over),
        so a dead steward is replaced only when a node calls
        ``next_rendezvous()`` again; those trials are not checked here.
        A short pause must not mark it (nobody leaves); a paused steward marks
        nothing until it resumes, like a dead one.
        """
        if self.store_dead or self.result.steward_killed or self.result.steward_paused:
            return
        if self.plan.pause == "short":
            return
        bound = self.plan.liveness_bound
        key = self.key(f"stale/{round_}")

        def wait(store: TCPStore) -> bool:
            try:
                store.wait([key], bound + 3.0)
            except StoreError:
                return False
            return True

        assert self.client is not None
        self.result.stale_marked = wait(self.client)
        if not self.result.stale_marked:
            self.result.problems.append(
                f"round {round_} was not marked stale within {bound + 3.0:g} s of the kill"
            )

    # -- after the kill: agents re-join until they agree --------------------------------
    def settle(self, after_pause: bool = False) -> None:
        """Drive the survivors like agents until each ends in a round or an error.

        ``after_pause``: the victims of a long pause were just resumed, the
        others had re-formed without them (the closing, if any, is done).
        """
        survivors = self.survivors()
        dead = {node_id(node) for node in self.killed + self.paused}
        by_name = {node.name: node for node in survivors}
        if self.plan.phase == "closing" and not after_pause:
            self.finish_closing(survivors)
        for node in survivors:
            self.rejoin_if_needed(node, dead, by_name)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            waiting = [node for node in survivors if self.unanswered[node.name] > 0]
            if not waiting:
                break
            for node in waiting:
                answer = node.poll(0.01)
                if answer is None:
                    continue
                self.take(node, answer)
                # An answer that misses a live survivor, names a dead node or is
                # older than another's: the agents holding it restart, as they
                # would on num_nodes_waiting() or on a failed worker.
                for other in survivors:
                    self.rejoin_if_needed(other, dead, by_name)
        outstanding = sorted(node.name for node in survivors if self.unanswered[node.name] > 0)
        if outstanding:
            self.result.problems.append(
                f"{outstanding} still in next_rendezvous() {SETTLE_TIMEOUT:g} s after "
                f"the {'resumption' if after_pause else 'kill'}"
            )

    def rejoin_if_needed(
        self, node: NodeProcess, dead: set[str], live: dict[str, NodeProcess]
    ) -> None:
        """Send ``next`` to ``node`` if it has answered everything and needs a new round.

        A resumed victim rejoins once, unless an answer came after its
        resumption (a round it joined since): its peers went on without it.
        """
        if self.unanswered[node.name] > 0:
            return
        if node.name in self.rejoin_after_resume:
            self.rejoin_after_resume.discard(node.name)
            arrived = self.latest.get(node.name, {}).get("_arrived", 0.0)
            if arrived < self.resumed_at:
                self.send([node], "next")
                return
        if self.needs_rejoin(node, dead, live):
            self.send([node], "next")

    def finish_closing(self, survivors: Sequence[NodeProcess]) -> None:
        """The closer's answer if it survived; else another node closes, as agents do."""
        budget = CLOSE_TIMEOUT + READ_TIMEOUT + 10
        if self.closer is not None and self.closer in survivors:
            self.take(self.closer, self.closer.read(budget, "the answer to close"))
        elif not self.store_dead:
            self.send([survivors[0]], "close")
            self.take(survivors[0], survivors[0].read(budget, "the answer to 'close'"))

    def needs_rejoin(self, node: NodeProcess, dead: set[str], live: dict[str, NodeProcess]) -> bool:
        answer = self.latest.get(node.name)
        if answer is None:
            return True
        if "error" in answer:
            return False
        if answer.get("cmd") != "next" or self.plan.phase == "closing":
            # After the closing every node must hear of it (when nobody died, no
            # answer names a dead node to send them back).
            return True
        members = set(answer["participants"])
        if members & dead or not {node_id(n) for n in live.values()} <= members:
            return True
        rounds = [self.latest.get(name, {}).get("round") for name in live]
        newest = max((round_ for round_ in rounds if isinstance(round_, int)), default=None)
        round_ = answer.get("round")
        return isinstance(round_, int) and newest is not None and round_ < newest

    def judge(self) -> None:
        survivors = self.survivors()
        finals = [self.latest.get(node.name, {}) for node in survivors]
        errors = {answer.get("error") for answer in finals}
        if errors == {"RendezvousConnectionError"}:
            self.result.outcome = OUTCOME_CONNECTION
        elif errors == {"RendezvousClosedError"}:
            self.result.outcome = OUTCOME_CLOSED
        elif errors == {None} and all(answer.get("cmd") == "next" for answer in finals):
            self.result.outcome = self.check_reformed(survivors)
        else:
            kinds = Counter(str(answer.get("error") or answer.get("cmd")) for answer in finals)
            self.result.outcome = f"all {next(iter(kinds))}" if len(kinds) == 1 else "mixed"
            messages = {str(answer.get("message", ""))[:300] for answer in finals} - {""}
            self.result.problems.append(
                f"survivors ended in {dict(kinds)}" + (f": {sorted(messages)}" if messages else "")
            )
        if self.result.outcome == OUTCOME_CLOSED:
            closed = [node.request("closed?", READ_TIMEOUT + 5).get("value") for node in survivors]
            if closed != [True] * len(survivors):
                self.result.problems.append(f"closed? after closing: {closed}")

    def check_reformed(self, survivors: Sequence[NodeProcess]) -> str:
        finals = {node.name: self.latest[node.name] for node in survivors}
        lists = {tuple(answer["participants"]) for answer in finals.values()}
        if len(lists) != 1:
            self.result.problems.append(f"survivors hold different participant lists: {lists}")
            return "disagreed"
        members = list(next(iter(lists)))
        expected = {node_id(node) for node in survivors}
        problems = []
        if set(members) != expected or len(members) != len(expected):
            problems.append(f"participants {members}, survivors {sorted(expected)}")
        ranks = sorted(answer["rank"] for answer in finals.values())
        if ranks != list(range(len(survivors))):
            problems.append(f"ranks {ranks} are not 0..{len(survivors) - 1}")
        for node in survivors:
            answer = finals[node.name]
            if answer["world_size"] != len(members):
                problems.append(f"{node.name}: world_size {answer['world_size']}")
            if members[answer["rank"]] != node_id(node):
                problems.append(f"{node.name} has rank {answer['rank']} but is {node_id(node)}")
        rounds = {answer.get("round") for answer in finals.values()}
        if len(rounds) != 1:
            problems.append(f"survivors hold the same list from different rounds {rounds}")
        self.result.problems += problems
        return "disagreed" if problems else OUTCOME_REFORMED

    def check_published(self) -> None:
        """Every round a node was told of, against its outcome in the store (when alive)."""
        if self.store_dead:
            return
        told: dict[int, set[tuple[str, ...]]] = defaultdict(set)
        for _, answer in self.history:
            if isinstance(answer.get("round"), int):
                told[answer["round"]].add(tuple(answer["participants"]))
        for round_, lists in sorted(told.items()):
            # The roster is written before the outcome: a round a node was told of has one.
            key = self.key(f"roster/{round_}")
            raw = self.store_call("reading a roster", lambda s, key=key: s.get(key))
            if raw is None:
                continue
            published = tuple(str(node) for node in decode_roster(raw, key).participants)
            for members in lists - {published}:
                self.result.split_brains.append(
                    f"round {round_}: nodes were told {list(members)}, the store published "
                    f"{list(published)}"
                )

    def check_still_there(self) -> None:
        """After a short pause: the victims are present, and a paused steward still decides."""
        for victim in self.resumed:
            key = self.key(f"present/{node_id(victim)}")
            if not self.store_call("checking presence", lambda s, key=key: s.check([key])):
                self.result.problems.append(f"{victim.name} is not present after a short pause")
        if self.result.steward_paused:
            pid = self.steward_pid()
            if pid not in {victim.pid for victim in self.resumed}:
                self.result.problems.append(
                    f"the paused steward lost the lease in a short pause (now pid {pid})"
                )

    def check_logs(self) -> None:
        records = [
            record for path in sorted(self.workdir.glob("n*.jsonl")) for record in read_log(path)
        ]
        found, committed = find_split_brains(self.run_id, records, self.history)
        self.result.split_brains += found
        self.result.rounds_committed = committed
        # A steward killed between saving a completed round and logging it takes
        # the round's record with it; its successor publishes the round unlogged
        # (check_published still compares what the nodes were told).
        if not committed and self.history and not self.result.steward_killed:
            self.result.problems.append("no round_complete record in any node's log")
        if self.plan.pause == "short":
            victims = {victim.pid: victim.name for victim in self.resumed}
            self.result.problems += short_pause_removals(
                self.run_id, records, victims, self.ended_at
            )

    # -- the whole trial ----------------------------------------------------------------
    def run(self) -> TrialResult:
        started = time.monotonic()
        try:
            self.start()
            getattr(self, f"phase_{self.plan.phase}")()
            self.settle()
            self.judge()
            if self.paused and self.result.passed:
                # The others went on without the frozen victims: now they come back.
                self.resume()
                self.settle(after_pause=True)
                self.judge()
            self.check_published()
            if self.plan.pause == "short":
                self.check_still_there()
        except Exception as exc:  # a node that did not answer in time, or a harness bug
            self.result.outcome = "harness-error"
            self.result.problems.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        finally:
            self.resume()
            self.ended_at = time.time()
            self.stop()
        self.check_logs()
        self.result.elapsed = time.monotonic() - started
        return self.result

    def stop(self) -> None:
        for node in self.nodes:
            if node.alive():
                with contextlib.suppress(AssertionError):
                    node.send("exit")
        deadline = time.monotonic() + 2.0
        for node in self.nodes:
            node.stop(grace=max(0.0, deadline - time.monotonic()))
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close()
        if self.store_host is not None and self.store_host.proc.poll() is None:
            self.store_host.kill()


@dataclasses.dataclass
class ChaosRun:
    """Every trial of one run, and the figures."""

    seed: int
    results: list[TrialResult]
    elapsed: float

    @property
    def split_brains(self) -> int:
        return sum(1 for result in self.results if result.split_brains)

    @property
    def failed(self) -> list[TrialResult]:
        return [result for result in self.results if not result.passed]

    def by_pause(self) -> dict[str, list[TrialResult]]:
        """The results of the trials of each kind of pause."""
        return {kind: [r for r in self.results if r.plan.pause == kind] for kind in PAUSES}

    def figures(self) -> str:
        """The table the lead quotes."""
        outcomes = Counter(result.outcome for result in self.results)
        phases = {
            phase: [r.plan for r in self.results if r.plan.phase == phase] for phase in PHASES
        }
        landed = Counter(
            f"{r.plan.phase}: {r.kill_landed}"
            for r in self.results
            if r.plan.phase in ("joining", "last_call")
        )
        stale = [r.stale_marked for r in self.results if r.stale_marked is not None]
        rows: list[tuple[str, object]] = [
            ("seed", f"{self.seed} (TP_CHAOS_SEED)"),
            ("trials run", len(self.results)),
            *((f"  outcome {kind}", count) for kind, count in sorted(outcomes.items())),
            ("trials passed", len(self.results) - len(self.failed)),
            ("split brains", self.split_brains),
            ("nodes killed", sum(r.nodes_killed for r in self.results)),
            ("store hosts killed", sum(r.plan.kill_store for r in self.results)),
            ("stewards killed", sum(r.steward_killed for r in self.results)),
            *(
                (
                    f"nodes paused {kind}",
                    f"{sum(r.nodes_paused for r in paused)} (stewards "
                    f"{sum(r.steward_paused for r in paused)})",
                )
                for kind, paused in self.by_pause().items()
            ),
            ("cascades (victims, then steward)", sum(r.plan.cascade for r in self.results)),
            ("rounds committed (logged)", sum(r.rounds_committed for r in self.results)),
            ("next() answers checked", sum(r.answers for r in self.results)),
            ("stale marked after a kill", f"{sum(stale)} of {len(stale)} (live steward)"),
            *((f"  kill {text}", count) for text, count in sorted(landed.items())),
            *(
                (
                    f"  trials {phase}",
                    f"{len(plans)} (hosted {sum(p.topology == 'hosted' for p in plans)}, "
                    f"store killed {sum(p.kill_store for p in plans)}, "
                    f"paused {sum(bool(p.pause) for p in plans)})",
                )
                for phase, plans in phases.items()
                if plans
            ),
            ("slowest trial", f"{max((r.elapsed for r in self.results), default=0):.1f} s"),
            ("total runtime", f"{self.elapsed:.1f} s"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = ["chaos figures", *(f"  {name:<{width}}  {value}" for name, value in rows)]
        lines += [result.describe() for result in self.failed]
        return "\n".join(lines)


def settings_from_env() -> tuple[int, int, int, int | None]:
    """(seed, trials, parallel, only) from ``TP_CHAOS_*`` (a fresh seed if none is set)."""
    raw_seed = os.environ.get("TP_CHAOS_SEED")
    seed = int(raw_seed) if raw_seed else random.SystemRandom().randrange(1, 10**6)
    trials = int(os.environ.get("TP_CHAOS_TRIALS") or CI_TRIALS)
    parallel = int(os.environ.get("TP_CHAOS_PARALLEL") or CI_PARALLEL)
    only = os.environ.get("TP_CHAOS_ONLY")
    return seed, trials, parallel, int(only) if only else None


def run_chaos(
    seed: int,
    trials: int,
    parallel: int,
    *,
    only: int | None = None,
    keep_logs: Path | None = None,
    progress: Any = None,
) -> ChaosRun:
    """Run ``trials`` trials (or the one numbered ``only``), ``parallel`` at a time."""
    indexes = [only] if only is not None else list(range(trials))
    root = Path(tempfile.mkdtemp(prefix="tp-chaos-", dir=keep_logs))
    started = time.monotonic()

    def one(index: int) -> TrialResult:
        workdir = root / f"trial-{index}"
        workdir.mkdir()
        result = Trial(plan_trial(seed, index), workdir).run()
        if progress is not None:
            progress(result.describe().splitlines()[0])
        if result.passed:
            shutil.rmtree(workdir, ignore_errors=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        results = list(pool.map(one, indexes))
    run = ChaosRun(seed, results, time.monotonic() - started)
    if not run.failed:
        shutil.rmtree(root, ignore_errors=True)
    return run
