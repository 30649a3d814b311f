"""Node processes of the rendezvous benchmarks: commands on stdin, messages on stdout.

A node process prints each message as one line, ``MESSAGE_PREFIX`` and a JSON
object with an ``event``; anything else it prints (torch's logging, say) is
passed through to the bench's stderr. ``rdzv_bench.py``'s kill scenario and
``spread.py`` use them.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from typing import Any

MESSAGE_PREFIX = "RDZV-BENCH "


def send_message(event: str, **fields: Any) -> None:
    """Print one message for the bench (in a node process)."""
    print(MESSAGE_PREFIX + json.dumps({"event": event, **fields}), flush=True)


class NodeProcess:
    """One node process: its stdin for commands, a thread forwarding its messages to ``inbox``.

    The inbox gets ``(slot, message)``, and ``(slot, {"event": "eof"})`` when the
    process's output ends.
    """

    def __init__(
        self,
        slot: int,
        command: list[str],
        inbox: queue.Queue[tuple[int, dict]],
        env: dict[str, str] | None = None,
    ) -> None:
        self.slot = slot
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env
        )
        threading.Thread(target=self._forward, args=(inbox,), daemon=True).start()

    def _forward(self, inbox: queue.Queue[tuple[int, dict]]) -> None:
        stdout = self.proc.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith(MESSAGE_PREFIX):
                inbox.put((self.slot, json.loads(line[len(MESSAGE_PREFIX) :])))
            else:
                sys.stderr.write(f"[node {self.slot}] {line}")
        inbox.put((self.slot, {"event": "eof"}))

    def tell(self, command: str) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """End the process by closing its stdin (under py-spy, which then writes its
        profile); killed if it has not ended within 30 s."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.proc.wait()
