"""The agent's handle on its bootstrap store's process (see :mod:`.bootstrap_child`)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable

from tp_store.security import SECRET_ENV, SECRET_FILE_ENV

#: Seconds the child may take to answer a command, its start included (it
#: imports the store server first; a loaded machine is slow).
ANSWER_TIMEOUT = 60.0
#: Seconds the child may take to exit once told to, before it is killed.
_EXIT_TIMEOUT = 5.0


def _idle(now: float) -> None:
    """No keep-alive while waiting."""


class BootstrapProcessError(Exception):
    """The bootstrap store's process failed: it died, did not answer, or could not listen."""


class BootstrapProcess:
    """A running child serving the workers' bootstrap store, driven over its stdin."""

    def __init__(self) -> None:
        command = [sys.executable, "-m", "tp_rdzv_dynamic.node.bootstrap_child", str(os.getpid())]
        # Linux kills the child when the thread that started it ends: only the
        # main thread lives as long as the agent.
        if threading.current_thread() is threading.main_thread():
            command.append("--die-with-parent")
        # torch's workers cannot prove a secret: the store has none, and the
        # child does not even see the rendezvous store's.
        env = {k: v for k, v in os.environ.items() if k not in {SECRET_ENV, SECRET_FILE_ENV}}
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        # A handler dropped without shutdown() must not leave its child running.
        self._finalizer = weakref.finalize(self, _end, self._process)

    @property
    def pid(self) -> int:
        return self._process.pid

    def exit_status(self) -> int | None:
        """``None`` while it runs; else its exit code (negative: the signal that ended it)."""
        return self._process.poll()

    def host(
        self, addr: str, keep_alive: Callable[[float], object] = _idle, tick: float = 1.0
    ) -> int:
        """Serve an empty store on ``addr``; its port (the last round's server is closed).

        While it waits for the answer (the child may still be starting),
        ``keep_alive(now)`` runs every ``tick`` seconds: the node heartbeats.
        """
        self._send(f"host {addr}")
        answer = self._answer(keep_alive, tick)
        kind, _, detail = answer.partition(" ")
        if kind == "port" and detail.isdigit():
            return int(detail)
        if kind == "error":
            raise BootstrapProcessError(f"cannot listen on {addr!r}: {detail}")
        raise BootstrapProcessError(f"the bootstrap store's process answered {answer!r}")

    def close_server(self) -> None:
        """Close the last round's server, without waiting."""
        if self.exit_status() is None:
            with contextlib.suppress(BootstrapProcessError):  # it died: nothing to close
                self._send("close")

    def stop(self) -> None:
        """End the child (its stdin closes) and reap it."""
        self._finalizer()

    def _send(self, line: str) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(line.encode() + b"\n")
            stdin.flush()
        except OSError as exc:
            raise self._died(f"({exc})") from exc

    def _answer(self, keep_alive: Callable[[float], object], tick: float) -> str:
        stdout = self._process.stdout
        assert stdout is not None
        deadline = time.monotonic() + ANSWER_TIMEOUT
        # Not select.select: an agent with many connections has descriptors past its 1024.
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while not (ready := selector.select(min(tick, max(deadline - time.monotonic(), 0)))):
                now = time.monotonic()
                if now >= deadline:
                    break
                keep_alive(now)
        if not ready:
            # Its answer may still come, and be taken for the next command's: end it.
            self.stop()
            raise BootstrapProcessError(
                f"the bootstrap store's process (pid {self.pid}) did not answer "
                f"within {ANSWER_TIMEOUT:g} s"
            )
        line = stdout.readline()
        if not line.endswith(b"\n"):
            raise self._died("while answering")
        return line.decode().rstrip("\n")

    def _died(self, when: str) -> BootstrapProcessError:
        try:
            status = self._process.wait(_EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            status = None
        return BootstrapProcessError(
            f"the bootstrap store's process (pid {self.pid}) exited {when}: {describe_exit(status)}"
        )


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.stdin is not None:
        with contextlib.suppress(OSError):  # it died first: the pipe is broken
            process.stdin.close()
    try:
        process.wait(_EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


def describe_exit(status: int | None) -> str:
    """``exit code 1``, ``killed by SIGKILL``, or that it has not exited."""
    if status is None:
        return "it has not exited"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit code {status}"
