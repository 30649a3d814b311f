"""The seven rendezvous exceptions, all subclasses of ``RendezvousError``.

``RendezvousTimeoutError`` is also a ``TimeoutError`` and
``RendezvousConnectionError`` also a ``ConnectionError``, so plain Python code
can catch them too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any


class RendezvousError(Exception):
    """Base class for all rendezvous failures."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous has been closed and accepts no more participants."""


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """A rendezvous phase exceeded its time budget."""


class RendezvousConnectionError(RendezvousError, ConnectionError):
    """The rendezvous backend store could not be reached."""


class RendezvousStateError(RendezvousError):
    """The rendezvous state is corrupt or the backend rejected an update."""


class RendezvousGracefulExitError(RendezvousError):
    """Raised to unwind an agent when it is the last node leaving."""


_MISSING = object()


def _field(config: object, name: str) -> Any:
    """``config[name]`` for a mapping, ``config.name`` otherwise; ``_MISSING`` if absent."""
    if isinstance(config, Mapping):
        return config.get(name, _MISSING)
    return getattr(config, name, _MISSING)


def _count(config: object, name: str) -> int:
    value = _field(config, name)
    if value is _MISSING:
        raise TypeError(
            f"RendezvousExhaustedError needs a config exposing {name!r} "
            f"(attribute or mapping key), got {config!r}"
        )
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(
            f"RendezvousExhaustedError config field {name!r} must be an int >= 0, got {value!r}"
        )
    return value


def _as_timedelta(timeout: object) -> timedelta:
    if isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        if not math.isfinite(timeout):
            raise TypeError(
                f"RendezvousExhaustedError timeout must be finite seconds, got {timeout!r}"
            )
        return timedelta(seconds=timeout)
    raise TypeError(
        f"RendezvousExhaustedError timeout must be a timedelta or seconds, got {timeout!r}"
    )


class RendezvousExhaustedError(RendezvousError):
    """The rendezvous join window elapsed without reaching min nodes.

    Args:
        config: what the rendezvous knew when it gave up: an object (for
            example the backend's settings or state) or a ``Mapping`` that
            exposes ``min_nodes`` (int, the nodes needed) and ``joined``
            (int, how many nodes had joined), and optionally ``run_id``.
        timeout: how long the rendezvous waited, as a ``timedelta`` or seconds.

    The exception keeps both as ``config`` and ``timeout`` (the latter
    normalised to a ``timedelta``), plus ``min_nodes``, ``joined`` and
    ``run_id`` (``None`` when the config has none) for convenience.
    """

    def __init__(self, config: object, timeout: timedelta | float) -> None:
        self.config = config
        self.timeout = _as_timedelta(timeout)
        self.min_nodes = _count(config, "min_nodes")
        self.joined = _count(config, "joined")
        run_id = _field(config, "run_id")
        self.run_id: str | None = None if run_id is _MISSING or run_id is None else str(run_id)
        where = f"rendezvous {self.run_id!r}" if self.run_id is not None else "the rendezvous"
        seconds = self.timeout.total_seconds()
        super().__init__(
            f"{where} gave up: {self.joined} node(s) joined but at least "
            f"{self.min_nodes} were needed (min_nodes); timed out after waiting "
            f"{seconds:g} s ({self.timeout})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle through the constructor arguments (the message is derived from them)."""
        return (type(self), (self.config, self.timeout))
