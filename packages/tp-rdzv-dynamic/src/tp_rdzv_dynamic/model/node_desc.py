"""Node descriptors: who a rendezvous participant is, and the natural order of ranks."""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
from dataclasses import dataclass

# ASCII digits only: a "digit" such as "²" or "٣" is text (int() refuses "²").
_DIGITS = re.compile(r"([0-9]+)")
#: The longest node address accepted: its heartbeat key must stay far below a
#: store's key limit (8 KiB on tp-store, 4 bytes a character at most).
MAX_ADDR_LENGTH = 1024


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


def node_from_fields(addr: object, pid: object, local_id: object) -> _NodeDesc:
    """The node a document names by ``addr, pid, local_id``; ``ValueError`` if malformed."""
    # Plain tests, no generator: the state of a large run names thousands of nodes.
    if (
        isinstance(addr, str)
        and 0 < len(addr) <= MAX_ADDR_LENGTH
        and type(pid) is int
        and pid >= 0
        and type(local_id) is int
        and local_id >= 0
    ):
        return _NodeDesc(addr, pid, local_id)
    raise ValueError(
        f"expected an address of 1 to {MAX_ADDR_LENGTH} characters and two ints >= 0, "
        f"got {[addr, pid, local_id]!r:.200}"
    )


def natural_key(node: _NodeDesc) -> tuple[tuple[tuple[int, int, str], ...], int, int]:
    """The sort key of the natural order: ``node2`` before ``node10``, then pid, then local id.

    Runs of digits compare by value without becoming ints (a run of 5000
    digits is too long for ``int()``): by length without leading zeros, then
    as text.
    """
    parts = []
    # split() alternates text and the digit runs it captured.
    for index, part in enumerate(_DIGITS.split(node.addr.lower())):
        if index % 2:
            digits = part.lstrip("0")
            parts.append((0, len(digits), digits))
        elif part:
            parts.append((1, 0, part))
    return tuple(parts), node.pid, node.local_id


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
