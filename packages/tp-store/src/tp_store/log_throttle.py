"""At most so many log lines per interval, the rest summed up in one line."""

from __future__ import annotations

import logging
import math
import time

log = logging.getLogger("tp_store.server")


class LogThrottle:
    """At most ``lines`` log lines per ``interval`` seconds; the rest are counted
    and reported in one summary line when the next interval begins."""

    def __init__(self, lines: int, interval: float) -> None:
        self._lines = lines
        self._interval = interval
        self._started = -math.inf  # time.monotonic() when the current interval began
        self._logged = 0
        self.suppressed = 0

    def allow(self) -> bool:
        """Whether a line may be logged now (else it is counted as suppressed)."""
        self.flush()
        if self._logged < self._lines:
            self._logged += 1
            return True
        self.suppressed += 1
        return False

    def flush(self, final: bool = False) -> None:
        """Start a new interval if the current one is over (or ``final``), summing up
        what it suppressed."""
        now = time.monotonic()
        if now - self._started < self._interval and not final:
            return
        if self.suppressed:
            log.warning(
                "suppressed %d more log line(s) about bad connections in %.1f s",
                self.suppressed,
                now - self._started,
                extra={"action": "log_suppressed", "reason": "too many bad connections"},
            )
        self._started = now
        self._logged = 0
        self.suppressed = 0
