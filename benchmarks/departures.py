"""The log records that say when a rendezvous knew a node was gone: detection time.

The benchmarks' *detection time* runs from a node's SIGKILL to the first of
these records naming it, in whichever process logged it:

- ours: a structured event of ``tp_rdzv_dynamic`` (``events.py``: the
  ``action`` and ``node`` attributes of the record) whose action is in
  :data:`REMOVAL_ACTIONS`, logged by the steward when it removes the node:
  ``node_dead`` (heartbeat counters: the node missed its heartbeats for the
  liveness bound) or ``node_gone`` (presence: the node's store session
  ended); the record's ``node`` must name the removed node. The records of
  a node taking office, :data:`TAKEOVER_ACTIONS` (``steward_takeover``: it
  took the lease of a steward it found silent; ``steward_elected``: a steward
  starts deciding; their ``node`` is the new steward), are kept too: the first
  after a kill is the restart bench's ``takeover`` figure;
- torch: the moment a node's state sync drops the node for an expired
  heartbeat (its keep-alive thread syncs every interval), where torch logs
  ``Detected dead node '<node>', removing it from the rendezvous`` at DEBUG
  (``_BackendRendezvousStateHolder._sanitize``): torch's closest equivalent;
  the removal is written with that node's next state write. The method is
  wrapped to note it, rather than torch's logger opened to DEBUG: with DEBUG
  on, torch's sync also records an event per removal, which changes what is
  measured (and torch's agent log grows by lines per second).

Both sides name a node ``<addr>_<pid>_<local id>``: :func:`node_pid`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: Our steward's records of a node's removal (``node_dead``: heartbeats; ``node_gone``: presence).
REMOVAL_ACTIONS = frozenset({"node_dead", "node_gone"})
#: Our records of a node taking office as the steward.
TAKEOVER_ACTIONS = frozenset({"steward_takeover", "steward_elected"})
#: The action given to torch's removal records.
TORCH_REMOVAL = "torch_dead_node"
OURS_LOGGER = "tp_rdzv_dynamic"


@dataclass(frozen=True)
class Departure:
    """One record: what it says, about which node, and when (both clocks)."""

    action: str  # one of REMOVAL_ACTIONS, TAKEOVER_ACTIONS or TORCH_REMOVAL
    node: str  # the removed node; for a takeover, the new steward
    wall: float  # time.time() of the record
    monotonic: float  # time.monotonic() (system-wide) when it was noted

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> Departure:
        return cls(**item)

    @property
    def is_removal(self) -> bool:
        return self.action not in TAKEOVER_ACTIONS


def node_pid(node: str) -> int | None:
    """The pid in a node's name ``<addr>_<pid>_<local id>``, or None if it has none."""
    parts = node.rsplit("_", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


class _DepartureHandler(logging.Handler):
    def __init__(self, report: Callable[[Departure], None]) -> None:
        super().__init__(logging.DEBUG)
        self._report = report

    def emit(self, record: logging.LogRecord) -> None:
        action = getattr(record, "action", None)
        if action in REMOVAL_ACTIONS or action in TAKEOVER_ACTIONS:
            node = str(getattr(record, "node", ""))
            self._report(Departure(action, node, record.created, time.monotonic()))


def watch_departures(report: Callable[[Departure], None], with_torch: bool = False) -> None:
    """Call ``report`` with every departure logged (ours) or noted (``with_torch``) in
    this process from now on.

    Our logger is opened to INFO (its removals are WARNING today); the handler
    is added to it alone and its records still propagate as before (but
    logging's last resort, which prints warnings when a process configured no
    handler, now stays silent: ``logged_torchrun.py`` prints them itself).
    """
    ours = logging.getLogger(OURS_LOGGER)
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)
    ours.addHandler(_DepartureHandler(report))
    if with_torch:
        _watch_torch(report)


def _watch_torch(report: Callable[[Departure], None]) -> None:
    """Note every node torch's state sync drops for an expired heartbeat."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    holder = dynamic_rendezvous._BackendRendezvousStateHolder
    sanitize = holder._sanitize

    def noting_sanitize(self: Any) -> None:
        sanitize(self)
        for node in self._dead_nodes:  # what torch logs as "Detected dead node"
            report(Departure(TORCH_REMOVAL, str(node), time.time(), time.monotonic()))

    holder._sanitize = noting_sanitize  # type: ignore[method-assign]


def first_removal(departures: Iterable[Departure], pid: int, after_wall: float) -> Departure | None:
    """The first removal record of the node of ``pid`` at or after ``after_wall``."""
    found = [
        d for d in departures if d.is_removal and node_pid(d.node) == pid and d.wall >= after_wall
    ]
    return min(found, key=lambda d: d.wall, default=None)


def removal_times(
    departures: Iterable[Departure], pids: Iterable[int], after_monotonic: float
) -> dict[str, float]:
    """Each node of the processes ``pids`` that a record removed: its first removal's
    monotonic time at or after ``after_monotonic``."""
    wanted = set(pids)
    found: dict[str, float] = {}
    for d in departures:
        if d.is_removal and node_pid(d.node) in wanted and d.monotonic >= after_monotonic:
            found[d.node] = min(d.monotonic, found.get(d.node, d.monotonic))
    return found


def first_takeover(departures: Iterable[Departure], after_wall: float) -> Departure | None:
    """The first takeover record at or after ``after_wall``."""
    found = [d for d in departures if not d.is_removal and d.wall >= after_wall]
    return min(found, key=lambda d: d.wall, default=None)


def read_departures(directory: Path) -> list[Departure]:
    """Every record in the JSON-lines files of ``directory`` (``logged_torchrun.py``'s)."""
    return [
        Departure.from_json(json.loads(line))
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
