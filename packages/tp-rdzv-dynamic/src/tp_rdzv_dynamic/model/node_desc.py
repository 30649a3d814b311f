"""Node descriptors: who a rendezvous participant is, and the natural order of ranks."""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
from dataclasses import dataclass

from tp_rdzv_dynamic.quoting import quoted

# ASCII digits only: a "digit" such as "²" or "٣" is text (int() refuses "²").
_DIGITS = re.compile(r"([0-9]+)")
#: The longest node address accepted: its heartbeat key must stay far below a
#: store's key limit (8 KiB on tp-store, 4 bytes a character at most).
MAX_ADDR_LENGTH = 1024
#: The largest pid or local id accepted: a node key stays short whatever a store holds.
MAX_NODE_NUMBER = 2**63 - 1


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
        type(pid) is int
        and 0 <= pid <= MAX_NODE_NUMBER
        and type(local_id) is int
        and 0 <= local_id <= MAX_NODE_NUMBER
        and isinstance(addr, str)
        and address_problem(addr) is None
    ):
        return _NodeDesc(addr, pid, local_id)
    raise ValueError(
        f"expected an address of 1 to {MAX_ADDR_LENGTH} printable characters and two ints "
        f"from 0 to 2**63-1, got [{quoted(addr)}, {quoted(pid)}, {quoted(local_id)}]"
    )


def address_problem(addr: object) -> str | None:
    """Why ``addr`` cannot be a node's address, or ``None`` if it can.

    An address is part of store keys (UTF-8: a lone surrogate cannot be one)
    and of log lines and the CLI's tables (a control character would forge
    lines): it is printable text, which excludes both, of bounded length.
    """
    if not isinstance(addr, str):
        return f"is a {type(addr).__name__}, not a str"
    if not 0 < len(addr) <= MAX_ADDR_LENGTH:
        return f"has {len(addr)} characters, not 1 to {MAX_ADDR_LENGTH}"
    if not addr.isprintable():
        return "holds characters that are not printable (control characters, lone surrogates)"
    return None


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
        """A new descriptor for a handler of this process, at ``local_addr`` or this host's FQDN.

        Raises ``ValueError`` if ``local_addr`` cannot be an address (:func:`address_problem`).
        """
        addr = local_addr or socket.getfqdn()
        problem = address_problem(addr)
        if problem is not None:
            raise ValueError(f"the node address {quoted(addr)} {problem}")
        with self._lock:
            local_id = next(self._ids)
        return _NodeDesc(addr, os.getpid(), local_id)
