"""The process that serves the workers' bootstrap store for its agent.

``python -m tp_rdzv_dynamic.node.bootstrap_child PARENT_PID [--die-with-parent]``
reads commands from its stdin, one a line, and serves the store on its own
event loop, so a flood of the store's port never delays the agent's timers,
and what the workers store never grows the agent's memory:

- ``host ADDR``: close the server of the last round (its keys and
  connections go with it), then listen on ``ADDR`` (a port picked by the
  system); it answers ``port N``, or ``error MESSAGE`` when ``ADDR`` cannot be
  bound (never a fallback to every interface).
- ``close``: close the server of the last round; no answer.

It exits when its stdin ends: the agent closed it, or died (the kernel closes
a dead process's pipes). ``--die-with-parent`` asks Linux to kill it with its
parent too (``PR_SET_PDEATHSIG``), which holds even when a forked worker
inherited the pipe's other end; the agent asks for it only from its main
thread, because Linux sends the signal when the thread that started the child
ends.

It never reads ``TP_STORE_SECRET`` or ``TP_STORE_SECRET_FILE``: torch's workers
cannot prove a secret, so the server has none.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence

from tp_store import Limits
from tp_store.server.store_server import StoreServer, new_event_loop

#: One job's handshakes: a few keys per worker (gloo's addresses, NCCL's unique
#: ids, c10d's barrier counters) for tens of thousands of workers, with room.
BOOTSTRAP_LIMITS = Limits(
    max_keys=256 * 1024,
    max_stored_bytes=64 * 1024 * 1024,
    max_message_bytes=16 * 1024 * 1024,
)
#: Bytes held for clients in flight (requests being received, unread replies).
BOOTSTRAP_MEMORY_BUDGET = 64 * 1024 * 1024
#: Every worker of a job connects at once when a round completes; the kernel
#: caps the backlog at net.core.somaxconn.
BOOTSTRAP_BACKLOG = 16 * 1024

_PR_SET_PDEATHSIG = 1
#: Allocations between the collector's youngest-generation passes (Python's default: 700).
_GC_THRESHOLD = 20_000

log = logging.getLogger(__name__)


def die_with_parent(parent_pid: int) -> None:
    """Have Linux kill this process when its parent dies; exit now if it has already."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    # The parent may have died before the request: its child was re-parented.
    if os.getppid() != parent_pid:
        os._exit(1)


class _Commands:
    """Applies the agent's commands, in order, to the server of the current round."""

    def __init__(self, out: int) -> None:
        self._out = out
        self._server: StoreServer | None = None
        self._buffer = b""
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()  # None: stdin ended

    def readable(self) -> None:
        data = os.read(sys.stdin.fileno(), 4096)
        if not data:
            asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
            self._lines.put_nowait(None)
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            self._lines.put_nowait(line.decode())

    async def run(self) -> None:
        """Apply the commands until stdin ends."""
        while (line := await self._lines.get()) is not None:
            await self._apply(line)

    async def _apply(self, line: str) -> None:
        command, _, argument = line.partition(" ")
        await self.close()
        if command == "host":
            server = StoreServer(
                argument,
                0,
                backlog=BOOTSTRAP_BACKLOG,
                limits=BOOTSTRAP_LIMITS,
                memory_budget=BOOTSTRAP_MEMORY_BUDGET,
            )
            try:
                await server.start()
            except OSError as exc:
                self._answer(f"error {exc}")
                return
            self._server = server
            self._answer(f"port {server.port}")
        elif command != "close":
            self._answer(f"error unknown command {command!r}")

    async def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.close()

    def _answer(self, text: str) -> None:
        os.write(self._out, text.encode() + b"\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parent_pid = int(args[0])
    if "--die-with-parent" in args:
        die_with_parent(parent_pid)
    # The agent handles Ctrl-C for its process group; this one ends with its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # A storm makes tens of thousands of objects per second that live as long as
    # their connections: scanned less often, they cost the collector less CPU.
    gc.freeze()
    gc.set_threshold(_GC_THRESHOLD, 20, 20)
    loop = new_event_loop()
    commands = _Commands(sys.stdout.fileno())

    async def run() -> None:
        loop.add_reader(sys.stdin.fileno(), commands.readable)
        try:
            await commands.run()
        finally:
            await commands.close()

    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
