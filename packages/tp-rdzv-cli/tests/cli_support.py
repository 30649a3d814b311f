"""Running the installed ``tp-rdzv`` command for real, in subprocesses."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

import pytest

#: The console script as pip installed it next to this interpreter.
TP_RDZV = Path(sysconfig.get_path("scripts")) / "tp-rdzv"
#: How long any one expected line may take (generous for a loaded CI machine).
TIMEOUT = 60.0


# Starts a program with SIGINT ignored, as a non-interactive shell starts a background
# job (an ignored signal stays ignored across exec).
_IGNORING_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]


class Command:
    """A running ``tp-rdzv`` whose stdout lines arrive on a queue (no polling).

    ``sigint_ignored`` starts it the way ``tp-rdzv ... &`` in a script does.
    """

    def __init__(self, args: list[str], *, sigint_ignored: bool = False) -> None:
        self.args = args
        self.process = subprocess.Popen(
            [*(_IGNORING_SIGINT if sigint_ignored else []), str(TP_RDZV), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.stderr = ""
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def line(self, timeout: float = TIMEOUT) -> str:
        """The next line of stdout; fails the test on timeout or end of output."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no output from tp-rdzv {' '.join(self.args)} within {timeout} s")
        if line is None:
            code, err = self.wait()
            pytest.fail(f"tp-rdzv {' '.join(self.args)} ended (exit {code}): {err}")
        return line

    def event(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The next stdout line, parsed as JSON."""
        document = json.loads(self.line(timeout))
        assert isinstance(document, dict)
        return document

    def wait(self, timeout: float = TIMEOUT) -> tuple[int, str]:
        """The exit code and stderr once the process has ended."""
        self.process.wait(timeout)
        assert self.process.stderr is not None
        self.stderr += self.process.stderr.read()
        return self.process.returncode, self.stderr

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the process."""
        self.process.send_signal(signum)

    def stop(self) -> None:
        """Kill the process if it still runs."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


def run_tp_rdzv(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``tp-rdzv args`` to completion."""
    return subprocess.run(
        [str(TP_RDZV), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one line a failed command wrote to stderr, checking that it exited with ``code``."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def unique_run_id() -> str:
    """A run id no other test uses."""
    return f"run-{time.monotonic_ns()}"
