"""Trying a cluster's members in turn: one rule for every request and watch, over either transport.

A member that cannot serve a request (:class:`MemberUnavailable`) is skipped
for the next one; once every member failed, the next pass comes after a short
back-off (an election is under way, or members are restarting). When no
member can even be connected to for a few passes in a row, the call fails at
once: waiting for the deadline would not bring a dead cluster back. The member
that last served is asked first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from tp_rdzv_etcd.endpoints import Endpoint

#: Passes over every member, all unreachable, before a call gives up early.
UNREACHABLE_PASSES = 3
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 0.5

_T = TypeVar("_T")


class MemberUnavailable(Exception):
    """One member could not serve one request; the call may go on elsewhere."""

    def __init__(self, message: str, *, reached: bool, ambiguous: bool) -> None:
        super().__init__(message)
        self.reached = reached  # the member was connected to
        self.ambiguous = ambiguous  # the request may have been applied


class NoMemberServed(Exception):
    """No member served the call: the deadline passed, or (``unreachable``) none
    could be reached for :data:`UNREACHABLE_PASSES` passes. ``last``: the last failure."""

    def __init__(self, last: str, *, unreachable: bool) -> None:
        self.unreachable = unreachable
        self.why = (
            f"no member can be reached ({last})"
            if unreachable
            else f"no answer before the deadline ({last})"
        )
        super().__init__(self.why)


class Members:
    """A cluster's members, the one that last served first (thread-safe)."""

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = tuple(endpoints)
        self._lock = threading.Lock()
        self._current = 0

    def fail_over(
        self,
        attempt: Callable[[Endpoint, float], _T],
        deadline: float,
        pause: Callable[[float], None] = time.sleep,
    ) -> _T:
        """``attempt(member, seconds left)`` on the members in turn until one serves it.

        Between passes it calls ``pause(seconds)``, which may return early
        (when a new leader is known: see :class:`.rpc.RaftTerm`).

        Raises:
            NoMemberServed: by ``deadline`` (monotonic), or early when no member
                can be reached.
        """
        backoff = FIRST_BACKOFF
        unreachable_passes = 0
        last = "no attempt"
        while True:
            reached_any = False
            for endpoint in self._rotation():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NoMemberServed(last, unreachable=False)
                try:
                    answer = attempt(endpoint, remaining)
                except MemberUnavailable as exc:
                    last = f"{endpoint}: {exc}"
                    reached_any = reached_any or exc.reached
                    continue
                self._prefer(endpoint)
                return answer
            unreachable_passes = 0 if reached_any else unreachable_passes + 1
            if unreachable_passes >= UNREACHABLE_PASSES:
                raise NoMemberServed(last, unreachable=True)
            wait = min(backoff, deadline - time.monotonic())
            if wait > 0:
                pause(wait)  # an election is under way, or members are restarting
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _rotation(self) -> list[Endpoint]:
        with self._lock:
            start = self._current
        return [*self.endpoints[start:], *self.endpoints[:start]]

    def _prefer(self, endpoint: Endpoint) -> None:
        with self._lock:
            self._current = self.endpoints.index(endpoint)
