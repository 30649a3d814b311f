"""``RendezvousTimeout``: the time budgets of the rendezvous phases."""

from __future__ import annotations

import math
from datetime import timedelta

_DEFAULTS = {
    "join": timedelta(seconds=600),
    "last_call": timedelta(seconds=30),
    "close": timedelta(seconds=30),
    "heartbeat": timedelta(seconds=5),
}


def positive_timedelta(value: object, what: str) -> timedelta:
    """``value`` (a ``timedelta`` or seconds as int/float) as a positive ``timedelta``.

    Anything else, NaN, infinities, zero and negatives raise a ``ValueError``
    naming ``what``.
    """
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
        try:
            result = timedelta(seconds=value)
        except OverflowError:
            raise ValueError(f"{what} is too large: {value!r} seconds") from None
    else:
        raise ValueError(f"{what} must be a timedelta or a number of seconds, got {value!r}")
    if result <= timedelta(0):
        shown = str(value) if isinstance(value, timedelta) else repr(value)
        raise ValueError(f"{what} must be positive, got {shown}")
    return result


class RendezvousTimeout:
    """Time budgets of the rendezvous phases.

    Args:
        join: how long to wait for the rendezvous to complete (600 s).
        last_call: how long to wait for more nodes once ``min_nodes`` have
            joined (30 s).
        close: how long to wait for the rendezvous to close after
            ``set_closed()`` (30 s).
        heartbeat: the keep-alive heartbeat timeout (5 s), kept for PyTorch
            compatibility. As in PyTorch, the dynamic backends find dead nodes
            by ``keep_alive_interval`` x ``keep_alive_max_attempt`` instead.

    Each is a ``timedelta`` or a number of seconds; ``None`` takes the
    default. Zero, negative or non-finite values raise a ``ValueError``
    naming the field.
    """

    __slots__ = ("_close", "_heartbeat", "_join", "_last_call")

    def __init__(
        self,
        join: timedelta | None = None,
        last_call: timedelta | None = None,
        close: timedelta | None = None,
        heartbeat: timedelta | None = None,
    ) -> None:
        given = {"join": join, "last_call": last_call, "close": close, "heartbeat": heartbeat}
        values = {
            name: _DEFAULTS[name] if value is None else positive_timedelta(value, f"{name} timeout")
            for name, value in given.items()
        }
        self._join = values["join"]
        self._last_call = values["last_call"]
        self._close = values["close"]
        self._heartbeat = values["heartbeat"]

    @property
    def join(self) -> timedelta:
        """How long to wait for the rendezvous to complete."""
        return self._join

    @property
    def last_call(self) -> timedelta:
        """How long to wait for more nodes once the minimum has joined."""
        return self._last_call

    @property
    def close(self) -> timedelta:
        """How long to wait for the rendezvous to close."""
        return self._close

    @property
    def heartbeat(self) -> timedelta:
        """The keep-alive heartbeat timeout (liveness uses the keep-alive settings instead)."""
        return self._heartbeat

    def _key(self) -> tuple[timedelta, ...]:
        return (self._join, self._last_call, self._close, self._heartbeat)

    def __eq__(self, other: object) -> bool:
        """Timeouts are equal when all four budgets are."""
        if not isinstance(other, RendezvousTimeout):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        """Hash of the four budgets."""
        return hash(self._key())

    def __repr__(self) -> str:
        """The four budgets, in seconds."""
        join, last_call, close, heartbeat = (t.total_seconds() for t in self._key())
        return (
            f"RendezvousTimeout(join={join:g}s, last_call={last_call:g}s, "
            f"close={close:g}s, heartbeat={heartbeat:g}s)"
        )
