"""Node descriptors: who a rendezvous participant is, and the natural order of ranks."""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
from dataclasses import dataclass

_DIGITS = re.compile(r"(\d+)")


@dataclass(frozen=True, slots=True)
class _NodeDesc:
    """One rendezvous participant: an agent in a process on a host.

    Attributes:
        addr: the node's address (the FQDN unless the user gave ``local_addr``).
        pid: the process id of the agent.
        local_id: distinguishes handlers created in the same process.

    ``str()`` (and ``repr()``) is ``addr_pid_local_id``, the same in every process.
    """

    addr: str
    pid: int
    local_id: int

    def __str__(self) -> str:
        return f"{self.addr}_{self.pid}_{self.local_id}"

    __repr__ = __str__

    @property
    def key(self) -> str:
        """The node's identity as text, used in store keys and documents."""
        return str(self)


#: The public name of node descriptors.
NodeDesc = _NodeDesc


def natural_key(node: _NodeDesc) -> tuple[tuple[tuple[int, int | str], ...], int, int]:
    """The sort key of the natural order: ``node2`` before ``node10``, then pid, then local id."""
    parts = tuple(
        (0, int(part)) if part.isdigit() else (1, part)
        for part in _DIGITS.split(node.addr.lower())
        if part
    )
    return parts, node.pid, node.local_id


class _NodeDescGenerator:
    """Hands out node descriptors, one ``local_id`` per handler in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def generate(self, local_addr: str | None = None) -> _NodeDesc:
        """A new descriptor for a handler of this process, at ``local_addr`` or this host's FQDN."""
        with self._lock:
            local_id = next(self._ids)
        return _NodeDesc(local_addr or socket.getfqdn(), os.getpid(), local_id)
