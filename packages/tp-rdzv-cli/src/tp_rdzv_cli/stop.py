"""SIGINT and SIGTERM as requests to stop, for a command that runs until stopped.

A command that a non-interactive shell starts in the background inherits SIGINT
ignored (POSIX), and Python then never raises KeyboardInterrupt: "until Ctrl-C"
would mean forever. So such a command installs handlers of its own.
"""

from __future__ import annotations

import os
import select
import signal
from types import FrameType, TracebackType

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While active, SIGINT and SIGTERM request a stop.

    The first signal is only noted, so a store call in progress finishes
    cleanly, and :meth:`wait` returns at once; a second one raises
    KeyboardInterrupt, to break out of a call that hangs. Afterwards both stay
    ignored: the process is on its way out, and a late signal must not kill it
    with its default action or interrupt its exit. Use it in the main thread.
    """

    def __init__(self) -> None:
        self._read_end, self._write_end = os.pipe()
        self._requested = False

    def __enter__(self) -> StopSignals:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        os.close(self._read_end)
        os.close(self._write_end)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._requested:
            raise KeyboardInterrupt
        self._requested = True
        # Wakes wait(): a signal that lands in select() is retried by Python (PEP 475).
        os.write(self._write_end, b"!")

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; ``True`` as soon as a stop was requested."""
        if not self._requested:
            select.select([self._read_end], [], [], seconds)
        return self._requested
