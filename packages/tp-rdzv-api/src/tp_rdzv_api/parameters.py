"""``RendezvousParameters``: what a caller asks of a rendezvous backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .coercion import to_bool, to_int, to_seconds
from .timeout import RendezvousTimeout

#: The config keys read by :attr:`RendezvousParameters.timeout`, by timeout field.
TIMEOUT_KEYS = {
    "join": "join_timeout",
    "last_call": "last_call_timeout",
    "close": "close_timeout",
    "heartbeat": "heartbeat_timeout",
}

# PyTorch's positional form: (backend, endpoint, run_id, min_nodes, max_nodes, local_addr).
_POSITIONAL = ("min_nodes", "max_nodes", "local_addr")


def _check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"RendezvousParameters {name} must be a str, got {value!r}")
    return value


def _check_int(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"RendezvousParameters {name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"RendezvousParameters {name} must be >= {minimum}, got {value}")
    return value


class RendezvousParameters:
    """Parameters describing one rendezvous request.

    endpoint is host:port of the rendezvous store, local_addr the
    address of this node (autodetected when empty), and config carries
    backend-specific options accessible through :meth:`get`.

    Args:
        backend: the registry name of the backend, e.g. ``"static"``;
            surrounding whitespace is stripped, empty (or ``None``, as in
            PyTorch) is a ``ValueError``.
        endpoint: ``host:port`` of the rendezvous store (may be empty).
        run_id: the identifier of the job.
        *args: PyTorch's positional form: ``min_nodes``, ``max_nodes`` and
            ``local_addr`` may follow ``run_id`` positionally.
        min_nodes: the least number of nodes; ``None`` means 1.
        max_nodes: the most number of nodes; ``None`` means ``min_nodes``
            (a fixed-size job).
        local_addr: this node's address; ``None`` lets the backend detect it.
        node_rank: this node's rank for backends with fixed ranks (>= 0).
        local_world_size: the number of workers on this node (>= 1).
        config: backend-specific options (keys are strings).
        **kwargs: more options, merged into ``config`` as PyTorch does; a key
            given both ways is a ``TypeError``.

    The arguments are kept as the attributes ``backend``, ``endpoint``,
    ``run_id``, ``min_nodes``, ``max_nodes``, ``local_addr``, ``node_rank``,
    ``local_world_size`` and ``config`` (a ``dict``). Wrong types raise
    ``TypeError``, out-of-range values ``ValueError``.
    """

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        *args: Any,
        min_nodes: int | None = None,
        max_nodes: int | None = None,
        local_addr: str | None = None,
        node_rank: int = 0,
        local_world_size: int = 1,
        config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if len(args) > len(_POSITIONAL):
            raise TypeError(
                "RendezvousParameters() takes at most 6 positional arguments (backend, endpoint, "
                f"run_id, min_nodes, max_nodes, local_addr) but {3 + len(args)} were given"
            )
        keywords: dict[str, Any] = {
            "min_nodes": min_nodes,
            "max_nodes": max_nodes,
            "local_addr": local_addr,
        }
        for name, value in zip(_POSITIONAL, args, strict=False):
            if keywords[name] is not None:
                raise TypeError(f"RendezvousParameters() got multiple values for argument {name!r}")
            keywords[name] = value

        if backend is None:  # PyTorch's error for a missing name
            raise ValueError("RendezvousParameters backend must be a non-empty string, got None")
        backend = _check_str("backend", backend).strip()
        if not backend:
            raise ValueError("RendezvousParameters backend must be a non-empty string")
        self.backend: str = backend
        self.endpoint: str = _check_str("endpoint", endpoint)
        self.run_id: str = _check_str("run_id", run_id)

        low = 1 if keywords["min_nodes"] is None else keywords["min_nodes"]
        self.min_nodes: int = _check_int("min_nodes", low, 1)
        high = self.min_nodes if keywords["max_nodes"] is None else keywords["max_nodes"]
        self.max_nodes: int = _check_int("max_nodes", high, 1)
        if self.max_nodes < self.min_nodes:
            raise ValueError(
                f"RendezvousParameters max_nodes ({self.max_nodes}) must be >= "
                f"min_nodes ({self.min_nodes})"
            )
        address = keywords["local_addr"]
        self.local_addr: str | None = None if address is None else _check_str("local_addr", address)
        self.node_rank: int = _check_int("node_rank", node_rank, 0)
        self.local_world_size: int = _check_int("local_world_size", local_world_size, 1)
        self.config: dict[str, Any] = self._merge_config(config, kwargs)

    @classmethod
    def convert(cls, params: object) -> RendezvousParameters:
        """``params`` as our parameters: itself when it is ours, else a copy.

        The copy is of any object with PyTorch's attributes ``backend``,
        ``endpoint``, ``run_id``, ``min_nodes``, ``max_nodes``, ``local_addr``
        and ``config`` (a mapping), as torchrun and PyTorch's
        ``RendezvousParameters`` give them; the values are checked as the
        constructor checks them. Anything else is a ``TypeError`` naming the
        missing attributes.
        """
        if isinstance(params, cls):
            return params
        fields = ("backend", "endpoint", "run_id", "min_nodes", "max_nodes", "local_addr", "config")
        missing = [name for name in fields if not hasattr(params, name)]
        if missing:
            raise TypeError(
                f"expected RendezvousParameters (ours or PyTorch's), got {params!r} "
                f"(no {', '.join(missing)})"
            )
        return cls(**{name: getattr(params, name) for name in fields})

    @staticmethod
    def _merge_config(config: object, kwargs: dict[str, Any]) -> dict[str, Any]:
        if config is None:
            merged: dict[str, Any] = {}
        elif isinstance(config, Mapping):
            merged = dict(config)
        else:
            raise TypeError(f"RendezvousParameters config must be a dict or None, got {config!r}")
        for key in merged:
            if not isinstance(key, str):
                raise TypeError(f"RendezvousParameters config keys must be str, got {key!r}")
        for key, value in kwargs.items():
            if key in merged:
                raise TypeError(
                    f"RendezvousParameters config option {key!r} was given both in config "
                    "and as a keyword argument"
                )
            merged[key] = value
        return merged

    def get(self, key: str, default: Any = None) -> Any:
        """Return backend parameter key or default."""
        return self.config.get(key, default)

    def _value(self, key: str) -> Any:
        """The raw value of ``key``; ``None`` when missing or set to ``None``."""
        return self.config.get(key)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """Return key coerced to bool (accepts 1/0/true/false).

        True: ``True``, 1, "1", "true", "t", "yes", "y"; False: ``False``, 0,
        "0", "false", "f", "no", "n" (case-insensitive, surrounding whitespace
        ignored). A missing key, or one set to ``None``, gives ``default``;
        any other value is a ``ValueError`` naming the key.
        """
        value = self._value(key)
        return default if value is None else to_bool(key, value)

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """Return key coerced to int.

        Ints and strings of a decimal integer are accepted; a missing key, or
        one set to ``None``, gives ``default``; anything else (``bool`` and
        floats included) is a ``ValueError`` naming the key.
        """
        value = self._value(key)
        return default if value is None else to_int(key, value)

    @property
    def timeout(self) -> RendezvousTimeout:
        """Timeouts assembled from join/last_call/close/heartbeat params (seconds).

        Read from the config keys ``join_timeout``, ``last_call_timeout``,
        ``close_timeout`` and ``heartbeat_timeout`` (numbers, numeric strings
        or ``timedelta``); missing keys take :class:`RendezvousTimeout`'s
        defaults, bad values are a ``ValueError`` naming the key.
        """
        given = {}
        for field, key in TIMEOUT_KEYS.items():
            value = self._value(key)
            if value is not None:
                given[field] = to_seconds(key, value)
        return RendezvousTimeout(**given)

    def __repr__(self) -> str:
        """Every attribute, as keyword arguments."""
        return (
            f"RendezvousParameters(backend={self.backend!r}, endpoint={self.endpoint!r}, "
            f"run_id={self.run_id!r}, min_nodes={self.min_nodes}, max_nodes={self.max_nodes}, "
            f"local_addr={self.local_addr!r}, node_rank={self.node_rank}, "
            f"local_world_size={self.local_world_size}, config={self.config!r})"
        )
