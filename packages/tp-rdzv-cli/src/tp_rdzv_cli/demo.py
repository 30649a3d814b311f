"""``tp-rdzv demo``: a rendezvous forming, losing nodes and re-forming, live.

The demo hosts the store in this process (the embedded default; or, with
``--backend etcd``, starts a throwaway local etcd member), starts N node
processes running ``tp-rdzv join``, and follows their JSON output: once every
node holds a rank in one round, it kills some with SIGKILL, waits for the
survivors' new round, closes the rendezvous and checks that every survivor
exits 0. Everything is driven by the nodes' events; nothing polls.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tp_rdzv_api import RendezvousParameters, create_handler
from tp_store import TCPStore

from .connect import rendezvous_errors
from .errors import CommandError, ExitCode
from .options import integer, positive_seconds

EXAMPLES = """examples:
  tp-rdzv demo                     # 4 nodes, kill 1
  tp-rdzv demo --nodes 8 --kill 3
  tp-rdzv demo --nodes 3 --kill 1 --json    # only the summary, as JSON
  tp-rdzv demo --backend etcd      # on a local etcd member (needs etcd-server and tp-rdzv-etcd)

It exits 0 when every step happened as expected."""

#: Node settings that make the demo quick: a silent node is dead after 1 s.
#: No node hosts a store (``is_host``): the demo provides it.
NODE_CONFIG = {
    "keep_alive_interval": 0.5,
    "keep_alive_max_attempt": 2,
    "last_call_timeout": 0.5,
    "join_timeout": 60,
    "is_host": False,
}
RUN_ID = "demo"
#: The most node processes a demo starts (each is a Python interpreter).
MAX_DEMO_NODES = 64
BACKENDS = ("core", "etcd")


class DemoFailed(Exception):
    """A step did not happen as expected; the message says which."""


class EmbeddedStore:
    """The default: a TCPStore server in the demo's own process."""

    def __init__(self) -> None:
        self._store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=30)
        self.endpoint = f"127.0.0.1:{self._store.port}"
        self.description = f"the embedded store at {self.endpoint}"

    def close(self) -> None:
        """Stop serving."""
        self._store.close()


class LocalEtcdMember:
    """A throwaway one-member etcd cluster on loopback, for ``--backend etcd``."""

    def __init__(self) -> None:
        try:
            from tp_rdzv_etcd.local import EtcdNotFoundError, LocalEtcd  # noqa: PLC0415
        except ImportError as exc:
            raise CommandError(
                "the etcd demo needs tp-rdzv-etcd: pip install 'tensorplay-rendezvous[etcd]'",
                ExitCode.USAGE,
            ) from exc
        try:
            self._etcd = LocalEtcd(1).start()
        except EtcdNotFoundError as exc:
            raise CommandError(str(exc), ExitCode.USAGE) from exc
        except RuntimeError as exc:
            raise CommandError(f"could not start etcd: {exc}", ExitCode.FAILED) from exc
        self.endpoint = self._etcd.endpoints
        self.description = f"a local etcd member at {self.endpoint}"

    def close(self) -> None:
        """Stop the member and remove its data."""
        self._etcd.stop()


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``demo``."""
    parser = commands.add_parser(
        "demo",
        parents=parents,
        help="watch a rendezvous form, lose nodes and re-form, live",
        description="Run N local node processes on an embedded store, kill some, "
        "and watch the survivors re-form.",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--nodes",
        type=integer(1, MAX_DEMO_NODES),
        default=4,
        help=f"node processes, at most {MAX_DEMO_NODES} (default 4)",
    )
    parser.add_argument(
        "--kill",
        type=integer(0, MAX_DEMO_NODES - 1),
        default=1,
        help="nodes to kill -9 (default 1)",
    )
    parser.add_argument(
        "--backend", default="core", choices=BACKENDS, help="core (default) or etcd"
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=120.0,
        help="give up after this many seconds (120)",
    )
    parser.add_argument("--json", action="store_true", help="print only the summary, as JSON")
    parser.set_defaults(run=run)


@dataclass
class Node:
    """One node process as the demo sees it."""

    name: str
    process: subprocess.Popen[str]
    status: str = "starting"
    round: int | None = None
    rank: int | None = None
    world_size: int | None = None
    participants: tuple[str, ...] = ()
    identity: str = ""  # the node's name in the rendezvous
    exit_code: int | None = None


@dataclass
class Timeline:
    """When each step happened, in seconds since the demo started."""

    started: float = field(default_factory=time.monotonic)
    steps: dict[str, float] = field(default_factory=dict)

    def mark(self, step: str) -> float:
        """Record ``step`` now; returns its time."""
        self.steps[step] = round(time.monotonic() - self.started, 3)
        return self.steps[step]


class Demo:
    """The demo's state and its steps."""

    def __init__(self, args: argparse.Namespace, console: Console) -> None:
        self.args = args
        self.console = console
        self.events: queue.Queue[tuple[Node, dict[str, Any] | None]] = queue.Queue()
        self.timeline = Timeline()
        self.deadline = self.timeline.started + args.timeout
        self.phase = "starting the store"
        self.nodes: list[Node] = []
        self.victims: list[Node] = []
        self.rounds: dict[str, dict[str, Any]] = {}
        self.logs = Path(tempfile.mkdtemp(prefix="tp-rdzv-demo-"))
        self.store = LocalEtcdMember() if args.backend == "etcd" else EmbeddedStore()
        self.endpoint = self.store.endpoint
        self.live: Live | None = None

    # -- the steps ------------------------------------------------------------------
    def run(self, live: Live | None) -> bool:
        """Run every step; whether each went as expected."""
        self.live = live
        try:
            self.phase = f"starting {self.args.nodes} nodes"
            self._start_nodes()
            self.phase = "forming the first round"
            first = self._await_round(self.nodes)
            self.rounds["first"] = {**first, "seconds_after_start": self.timeline.mark("formed")}
            survivors = self.nodes
            if self.args.kill:
                survivors = self._kill()
                self.phase = f"{len(survivors)} survivors re-forming"
                again = self._await_round(survivors, excluding=self.victims)
                took = time.monotonic() - self.timeline.started - self.timeline.steps["killed"]
                self.rounds["recovery"] = {**again, "seconds_after_kill": round(took, 3)}
                self.timeline.mark("recovered")
            self.phase = "closing the rendezvous"
            self._close()
            exited = self._await_exit(survivors)
            self.timeline.mark("exited")
            self.phase = "done"
            self._refresh()
            return exited
        except DemoFailed as exc:
            self.phase = f"FAILED: {exc}"
            self._refresh()
            return False
        finally:
            self._stop_all()
            self.store.close()

    def _start_nodes(self) -> None:
        config = ",".join(f"{key}={value}" for key, value in NODE_CONFIG.items())
        nodes = self.args.nodes
        for index in range(nodes):
            name = f"n{index}"
            command = [
                sys.executable,
                "-m",
                "tp_rdzv_cli",
                "join",
                "--backend",
                self.args.backend,
                "--endpoint",
                self.endpoint,
                "--run-id",
                RUN_ID,
                "--min",
                str(nodes - self.args.kill),
                "--max",
                str(nodes),
                "--config",
                config,
                "--json",
                "--log-level",
                "INFO",
                "--log-format",
                "json",
            ]
            log = (self.logs / f"{name}.log").open("w")
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1
            )
            log.close()
            node = Node(name, process)
            self.nodes.append(node)
            threading.Thread(
                target=self._read, args=(node, process.stdout), daemon=True, name=name
            ).start()
            node.status = "joining"
        self._refresh()

    def _read(self, node: Node, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.events.put((node, event))
        self.events.put((node, None))

    def _await_round(self, nodes: list[Node], excluding: Sequence[Node] = ()) -> dict[str, Any]:
        """Wait until every one of ``nodes`` holds a rank in one round with just them."""
        gone = {victim.identity for victim in excluding}
        while True:
            for node in nodes:
                if node.exit_code is not None:
                    log = self.logs / f"{node.name}.log"
                    raise DemoFailed(f"{node.name} exited with code {node.exit_code} (see {log})")
            rounds = {node.round for node in nodes}
            if len(rounds) == 1 and all(
                node.world_size == len(nodes) and not gone & set(node.participants)
                for node in nodes
            ):
                (round_,) = rounds
                return {"round": round_, "world_size": len(nodes)}
            self._next_event()

    def _kill(self) -> list[Node]:
        by_rank = sorted(self.nodes, key=lambda node: node.rank or 0)
        self.victims = by_rank[-self.args.kill :]
        self.timeline.mark("killed")
        for victim in self.victims:
            os.kill(victim.process.pid, signal.SIGKILL)
            victim.status = "killed (SIGKILL)"
        self._refresh()
        return [node for node in self.nodes if node not in self.victims]

    def _close(self) -> None:
        params = RendezvousParameters(
            self.args.backend,
            self.endpoint,
            RUN_ID,
            min_nodes=1,
            max_nodes=1,
            config={"is_host": False, "read_timeout": 30},
        )
        with rendezvous_errors():
            handler = create_handler(params)
            self.timeline.mark("closing")
            handler.set_closed()

    def _await_exit(self, nodes: list[Node]) -> bool:
        while any(node.exit_code is None for node in nodes):
            self._next_event()
        return all(node.exit_code == 0 for node in nodes)

    def _next_event(self) -> None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise DemoFailed(f"{self.phase} took longer than {self.args.timeout:g} s")
        try:
            node, event = self.events.get(timeout=remaining)
        except queue.Empty:
            raise DemoFailed(f"{self.phase} took longer than {self.args.timeout:g} s") from None
        if event is None:
            node.exit_code = node.process.wait()
            if node not in self.victims:
                node.status = f"exited ({node.exit_code})"
        elif event.get("event") == "round":
            node.round, node.rank = event["round"], event["rank"]
            node.world_size = event["world_size"]
            node.participants = tuple(event["participants"])
            node.identity = event["node"]
            node.status = "in the round"
        elif event.get("event") in ("closed", "spare_released"):
            node.status = "rendezvous closed"
        self._refresh()

    def _stop_all(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                node.process.kill()
            node.process.wait()

    # -- what is shown -----------------------------------------------------------------
    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self.view(), refresh=True)

    def view(self) -> RenderableType:
        """The live view: what each node is doing."""
        elapsed = time.monotonic() - self.timeline.started
        title = Text.assemble(
            ("tp-rdzv demo", "bold"),
            f": {self.args.nodes} nodes on {self.store.description}  ",
            (self.phase, "bold cyan"),
            f"  {elapsed:.1f} s",
        )
        table = Table()
        for column in ("node", "pid", "round", "rank", "status"):
            table.add_column(column)
        for node in self.nodes:
            style = "red" if node in self.victims else "green" if node.rank is not None else ""
            table.add_row(
                node.name,
                str(node.process.pid),
                "-" if node.round is None else str(node.round),
                "-" if node.rank is None else f"{node.rank} of {node.world_size}",
                Text(node.status, style=style),
            )
        return Group(title, table)

    def summary(self, ok: bool) -> dict[str, Any]:
        """What happened, for people (:func:`format_summary`) and scripts."""
        survivors = [node for node in self.nodes if node not in self.victims]
        return {
            "ok": ok,
            "backend": self.args.backend,
            "endpoint": self.endpoint,
            "store": self.store.description,
            "nodes": self.args.nodes,
            "killed": [node.name for node in self.victims],
            "first_round": self.rounds.get("first"),
            "recovery": self.rounds.get("recovery"),
            "exit_codes": {node.name: node.exit_code for node in survivors},
            "timeline": self.timeline.steps,
            "liveness_bound": NODE_CONFIG["keep_alive_interval"]
            * NODE_CONFIG["keep_alive_max_attempt"],
            "logs": str(self.logs),
        }


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as lines of text."""
    lines = [f"tp-rdzv demo: {'OK' if summary['ok'] else 'FAILED'}"]

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<13} {text}")

    row("store", f"{summary['store']} (backend {summary['backend']})")
    killed = summary["killed"]
    row(
        "nodes",
        f"{summary['nodes']} started, {len(killed)} killed with SIGKILL, "
        f"{summary['nodes'] - len(killed)} survived",
    )
    first = summary["first_round"]
    if first:
        row(
            "first round",
            f"round {first['round']}: {first['world_size']} nodes, ranks 0-"
            f"{first['world_size'] - 1}, {first['seconds_after_start']:.2f} s after start",
        )
    recovery = summary["recovery"]
    if killed:
        row("killed", f"{', '.join(killed)} at {summary['timeline']['killed']:.2f} s")
    if recovery:
        row(
            "re-formed",
            f"round {recovery['round']}: {recovery['world_size']} nodes, ranks 0-"
            f"{recovery['world_size'] - 1}, {recovery['seconds_after_kill']:.2f} s after the "
            f"kill (liveness bound {summary['liveness_bound']:g} s)",
        )
    codes = summary["exit_codes"]
    if codes and all(code is not None for code in codes.values()):
        closing = summary["timeline"]
        took = closing.get("exited", 0) - closing.get("closing", 0)
        row(
            "closed",
            f"{sum(code == 0 for code in codes.values())} of {len(codes)} agents exited 0, "
            f"{took:.2f} s after the close",
        )
    row("node logs", summary["logs"])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when every step went as expected."""
    if args.kill >= args.nodes:
        raise CommandError(
            f"--kill must be between 0 and --nodes - 1 ({args.nodes - 1}), got {args.kill}",
            ExitCode.USAGE,
        )
    console = Console()
    demo = Demo(args, console)
    if args.json:
        ok = demo.run(live=None)
        print(json.dumps(demo.summary(ok)), flush=True)
    else:
        with Live(demo.view(), console=console, auto_refresh=False) as live:
            ok = demo.run(live)
        print(f"\n{format_summary(demo.summary(ok))}", flush=True)
    return ExitCode.OK if ok else ExitCode.FAILED
