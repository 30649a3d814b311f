"""Liveness from heartbeat progress on the observer's own monotonic clock.

A heartbeat is a counter each node increments; nobody compares timestamps from
other hosts, so skewed wall clocks cannot make a live node look dead (or a dead
one alive).
"""

from __future__ import annotations

from collections.abc import Mapping


class LivenessTracker:
    """Finds the counters that have not moved for ``bound`` seconds of observer time."""

    def __init__(self, bound: float) -> None:
        self._bound = bound
        # key -> (last value seen, observer time when it last changed)
        self._seen: dict[str, tuple[object, float]] = {}
        # key -> the observer time to date its first sample at (see suspect)
        self._suspects: dict[str, float] = {}

    def observe(self, counters: Mapping[str, object], now: float) -> list[str]:
        """Record one sample of ``counters`` taken at ``now``; return the silent ones.

        Keys absent from the sample are forgotten, so a node that leaves and
        comes back starts afresh.
        """
        seen = self._seen
        fresh: dict[str, tuple[object, float]] = {}
        silent = []
        for key, value in counters.items():
            last = seen.get(key)
            if last is None:
                fresh[key] = (value, self._suspects.pop(key, now))
            elif last[0] != value:
                fresh[key] = (value, now)
            else:
                fresh[key] = last
                if now - last[1] >= self._bound:
                    silent.append(key)
        self._seen = fresh
        return silent

    def suspect(self, key: str, now: float, grace: float) -> None:
        """Judge ``key`` silent if its counter does not move within ``grace`` seconds of
        its first sample (its holder was already seen silent, as a steward's lease)."""
        self._suspects[key] = now - self._bound + grace

    def tracks(self, key: str) -> bool:
        """Whether the last sample had ``key``."""
        return key in self._seen

    def ages(self, now: float) -> dict[str, float]:
        """Seconds since each counter of the last sample last moved, as of ``now``."""
        return {key: now - changed for key, (_, changed) in self._seen.items()}
