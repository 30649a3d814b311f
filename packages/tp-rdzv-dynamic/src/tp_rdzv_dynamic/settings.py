"""``RendezvousSettings``: the configuration shared by every node of one rendezvous."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

from tp_rdzv_api import RendezvousTimeout
from tp_rdzv_api.timeout import positive_timedelta

# PyTorch's positional form: RendezvousSettings(run_id, min_nodes, max_nodes,
# timeout, keep_alive_interval, keep_alive_max_attempt).
_POSITIONAL = (
    "run_id",
    "min_nodes",
    "max_nodes",
    "timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
)
_DEFAULT_KEEP_ALIVE_INTERVAL = timedelta(seconds=5)


def _count(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"RendezvousSettings {name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"RendezvousSettings {name} must be >= {minimum}, got {value}")
    return value


class RendezvousSettings:
    """Configuration shared by the rendezvous state machine.

    Args:
        *args: PyTorch's positional form ``(run_id, min_nodes, max_nodes,
            timeout, keep_alive_interval, keep_alive_max_attempt)``.
        join: how long to wait for the rendezvous to complete (``timedelta``
            or seconds; 600 s by default). The four phase budgets are as in
            :class:`~tp_rdzv_api.RendezvousTimeout`; give them or ``timeout``,
            not both.
        last_call: how long to wait for more nodes once ``min_nodes`` have
            joined (30 s by default).
        close: how long to wait for the rendezvous to close (30 s by default).
        heartbeat: how long a node may go without a heartbeat before it is
            considered dead (5 s by default).
        min_nodes: the least number of nodes a round needs (>= 1).
        max_nodes: the most nodes a round admits (>= ``min_nodes``).
        run_id: the identifier of the job.
        timeout: all four budgets at once.
        keep_alive_interval: how often a node heartbeats (``timedelta`` or
            seconds; 5 s by default).
        keep_alive_max_attempt: after this many missed heartbeats a node is
            dead (>= 1; 3 by default).

    Wrong types raise ``TypeError``; out-of-range values ``ValueError``.
    Stable ranks are off: :meth:`with_stable_ranks` turns them on (the
    constructor keeps PyTorch's signature).
    """

    __slots__ = (
        "_keep_alive_interval",
        "_keep_alive_max_attempt",
        "_max_nodes",
        "_min_nodes",
        "_run_id",
        "_stable_ranks",
        "_timeout",
    )

    def __init__(
        self,
        *args: Any,
        join: timedelta | None = None,
        last_call: timedelta | None = None,
        close: timedelta | None = None,
        heartbeat: timedelta | None = None,
        min_nodes: int = 1,
        max_nodes: int = 1,
        run_id: str = "",
        timeout: RendezvousTimeout | None = None,
        keep_alive_interval: timedelta | None = None,
        keep_alive_max_attempt: int = 3,
    ) -> None:
        if len(args) > len(_POSITIONAL):
            raise TypeError(
                f"RendezvousSettings() takes at most {len(_POSITIONAL)} positional arguments "
                f"({', '.join(_POSITIONAL)}), got {len(args)}"
            )
        given: dict[str, Any] = {
            "run_id": run_id,
            "min_nodes": min_nodes,
            "max_nodes": max_nodes,
            "timeout": timeout,
            "keep_alive_interval": keep_alive_interval,
            "keep_alive_max_attempt": keep_alive_max_attempt,
        }
        defaults: dict[str, Any] = {
            "run_id": "",
            "min_nodes": 1,
            "max_nodes": 1,
            "timeout": None,
            "keep_alive_interval": None,
            "keep_alive_max_attempt": 3,
        }
        for name, value in zip(_POSITIONAL, args, strict=False):
            if given[name] is not defaults[name] and given[name] != defaults[name]:
                raise TypeError(f"RendezvousSettings() got multiple values for argument {name!r}")
            given[name] = value

        if not isinstance(given["run_id"], str):
            raise TypeError(f"RendezvousSettings run_id must be a str, got {given['run_id']!r}")
        self._run_id: str = given["run_id"]
        self._min_nodes = _count("min_nodes", given["min_nodes"], 1)
        self._max_nodes = _count("max_nodes", given["max_nodes"], 1)
        if self._max_nodes < self._min_nodes:
            raise ValueError(
                f"RendezvousSettings max_nodes ({self._max_nodes}) must be >= "
                f"min_nodes ({self._min_nodes})"
            )

        phases = {"join": join, "last_call": last_call, "close": close, "heartbeat": heartbeat}
        timeout = given["timeout"]
        if timeout is None:
            self._timeout = RendezvousTimeout(**phases)
        elif not isinstance(timeout, RendezvousTimeout):
            raise TypeError(
                f"RendezvousSettings timeout must be a RendezvousTimeout, got {timeout!r}"
            )
        elif any(value is not None for value in phases.values()):
            raise TypeError(
                "RendezvousSettings takes either timeout or join/last_call/close/heartbeat, "
                "not both"
            )
        else:
            self._timeout = timeout

        interval = given["keep_alive_interval"]
        self._keep_alive_interval = (
            _DEFAULT_KEEP_ALIVE_INTERVAL
            if interval is None
            else positive_timedelta(interval, "RendezvousSettings keep_alive_interval")
        )
        self._keep_alive_max_attempt = _count(
            "keep_alive_max_attempt", given["keep_alive_max_attempt"], 1
        )
        if self._keep_alive_max_attempt > timedelta.max / self._keep_alive_interval:
            raise ValueError(
                f"RendezvousSettings keep_alive_interval x keep_alive_max_attempt "
                f"({self._keep_alive_interval} x {self._keep_alive_max_attempt}) is too long"
            )
        self._stable_ranks = False

    def with_stable_ranks(self, stable: bool = True) -> RendezvousSettings:
        """These settings with stable ranks on (or off, with ``stable=False``).

        With stable ranks, a survivor of a round keeps its rank in the next
        one while the rank is below the new world size, and a node replacing
        a dead one takes its rank. Off (the default), survivors keep their
        relative order and the ranks close up behind a departed node.
        ``node_rank`` hints come first either way. The config key is
        ``stable_ranks``.
        """
        if not isinstance(stable, bool):
            raise TypeError(f"RendezvousSettings stable_ranks must be a bool, got {stable!r}")
        changed = copy.copy(self)
        changed._stable_ranks = stable
        return changed

    @property
    def run_id(self) -> str:
        """The identifier of the job."""
        return self._run_id

    @property
    def min_nodes(self) -> int:
        """The least number of nodes a round needs."""
        return self._min_nodes

    @property
    def max_nodes(self) -> int:
        """The most nodes a round admits."""
        return self._max_nodes

    @property
    def timeout(self) -> RendezvousTimeout:
        """The phase budgets."""
        return self._timeout

    @property
    def keep_alive_interval(self) -> timedelta:
        """How often a node heartbeats."""
        return self._keep_alive_interval

    @property
    def keep_alive_max_attempt(self) -> int:
        """How many heartbeats a node may miss before it is dead."""
        return self._keep_alive_max_attempt

    @property
    def stable_ranks(self) -> bool:
        """Whether survivors keep their ranks across rounds (see :meth:`with_stable_ranks`)."""
        return self._stable_ranks

    @property
    def liveness_bound(self) -> timedelta:
        """How long a node may stay silent: ``keep_alive_interval x keep_alive_max_attempt``."""
        return self._keep_alive_interval * self._keep_alive_max_attempt

    def __repr__(self) -> str:
        """Every setting, as keyword arguments."""
        return (
            f"RendezvousSettings(run_id={self._run_id!r}, min_nodes={self._min_nodes}, "
            f"max_nodes={self._max_nodes}, timeout={self._timeout!r}, "
            f"keep_alive_interval={self._keep_alive_interval.total_seconds():g}s, "
            f"keep_alive_max_attempt={self._keep_alive_max_attempt}, "
            f"stable_ranks={self._stable_ranks})"
        )
