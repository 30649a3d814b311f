"""The process-wide registry of rendezvous backends, and ``create_handler``.

A backend is a *creator*: a callable taking ``RendezvousParameters`` and
returning a ``RendezvousHandler``. Creators come from two sources:

- the entry-point group ``tensorplay.rendezvous.handlers`` of the installed
  distributions (``name = "module:callable"``), read once, lazily, the first
  time a name is needed; an entry point's module is imported only when its
  backend is created;
- :func:`register` calls.

A name may be provided by several sources (a backend's module may call
``register`` and also declare its entry point, a distribution may be on the
path twice) as long as they all resolve to the same creator: equal ones, as
in PyTorch, so the same bound method registered twice is one creator. Registering a
different creator under a registered name is a ``ValueError`` at once; a
conflict with an entry point not loaded yet is a ``ValueError`` when the name
is first created. There is no built-in list of backends.
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable

from .handler import RendezvousHandler
from .parameters import RendezvousParameters

#: The entry-point group backends are discovered in.
ENTRY_POINT_GROUP = "tensorplay.rendezvous.handlers"

#: What a backend provides: parameters in, handler out.
HandlerCreator = Callable[[RendezvousParameters], RendezvousHandler]


def _describe(creator: object) -> str:
    module = getattr(creator, "__module__", None)
    name = getattr(creator, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(creator)


class RendezvousHandlerRegistry:
    """A thread-safe map from backend names to handler creators.

    Args:
        entry_point_group: the entry-point group to discover backends in, or
            ``None`` for a registry filled by :meth:`register` only.
    """

    def __init__(self, entry_point_group: str | None = ENTRY_POINT_GROUP) -> None:
        self._group = entry_point_group
        self._lock = threading.Lock()
        self._creators: dict[str, HandlerCreator] = {}
        # name -> its entry points (distinct values), read once from the metadata.
        self._entry_points: dict[str, list[importlib.metadata.EntryPoint]] | None = None
        self._loaded: set[str] = set()

    @property
    def entry_point_group(self) -> str | None:
        """The entry-point group this registry discovers backends in."""
        return self._group

    def _discover(self) -> dict[str, list[importlib.metadata.EntryPoint]]:
        """The entry points of the group, by name (read once; call with the lock held)."""
        if self._entry_points is None:
            found: dict[str, list[importlib.metadata.EntryPoint]] = {}
            if self._group is not None:
                for entry in importlib.metadata.entry_points(group=self._group):
                    same_name = found.setdefault(entry.name, [])
                    if all(entry.value != other.value for other in same_name):
                        same_name.append(entry)
            self._entry_points = found
        return self._entry_points

    def register(self, name: str, creator: HandlerCreator) -> None:
        """Register ``creator`` as the backend ``name``.

        Registering the same creator again (an equal one: the same function,
        or the same bound method) is a no-op; a different creator under a name
        that already has one is a ``ValueError``.
        """
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(
                f"a rendezvous backend name must be a non-empty string without "
                f"surrounding whitespace, got {name!r}"
            )
        if not callable(creator):
            raise TypeError(f"the creator of rendezvous backend {name!r} must be callable")
        with self._lock:
            existing = self._creators.get(name)
            if existing is None:
                self._creators[name] = creator
            elif existing != creator:
                raise ValueError(
                    f"rendezvous backend {name!r} is already registered with creator "
                    f"{_describe(existing)}; cannot register {_describe(creator)}"
                )

    def names(self) -> list[str]:
        """Every known backend name (registered or from entry points), sorted."""
        with self._lock:
            return sorted(self._creators.keys() | self._discover().keys())

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is a known backend."""
        return name in self.names()

    def get_creator(self, name: str) -> HandlerCreator:
        """The creator of backend ``name``, loading its entry point if needed.

        Raises ``ValueError`` for a name that is not registered (listing the known ones) or
        when the sources of ``name`` disagree; ``RuntimeError`` when an entry
        point cannot be loaded.
        """
        with self._lock:
            entries = [] if name in self._loaded else list(self._discover().get(name, []))
            creator = self._creators.get(name)
            if creator is None and not entries:
                known = sorted(self._creators.keys() | self._discover().keys())
                raise ValueError(
                    f"rendezvous backend {name!r} is not registered; known backends: "
                    f"{', '.join(known) if known else '(none)'}"
                )
        # Import outside the lock: the module may call register() (from any thread).
        loaded: list[tuple[str, HandlerCreator]] = []
        for entry in entries:
            try:
                target = entry.load()
            except Exception as exc:
                raise RuntimeError(
                    f"cannot load rendezvous backend {name!r} from entry point "
                    f"{entry.value!r} (group {self._group!r}): {exc}"
                ) from exc
            if not callable(target):
                raise RuntimeError(
                    f"entry point {entry.value!r} of rendezvous backend {name!r} is not callable"
                )
            loaded.append((f"entry point {entry.value!r}", target))
        with self._lock:
            creator = self._creators.get(name)
            sources = [] if creator is None else [(f"register() ({_describe(creator)})", creator)]
            sources += loaded
            distinct: list[tuple[str, HandlerCreator]] = []
            for where, target in sources:
                if all(target != other for _, other in distinct):
                    distinct.append((where, target))
            if len(distinct) > 1:
                listing = "; ".join(where for where, _ in distinct)
                raise ValueError(f"rendezvous backend {name!r} has conflicting creators: {listing}")
            if creator is None:
                creator = sources[0][1]
                self._creators[name] = creator
            self._loaded.add(name)
            return creator

    def create_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        """Create the handler of ``params.backend``.

        PyTorch's ``RendezvousParameters`` are accepted too (converted by
        :meth:`RendezvousParameters.convert`; anything else is a ``TypeError``).
        Raises ``ValueError`` for an unknown backend (listing the known ones),
        ``TypeError`` when the creator returns something that is not a
        ``RendezvousHandler``, and ``RuntimeError`` when the handler's
        ``get_backend()`` is not the requested name.
        """
        params = RendezvousParameters.convert(params)
        creator = self.get_creator(params.backend)
        handler = creator(params)
        if not isinstance(handler, RendezvousHandler):
            raise TypeError(
                f"the creator of rendezvous backend {params.backend!r} returned "
                f"{handler!r}, not a RendezvousHandler"
            )
        actual = handler.get_backend()
        if actual != params.backend:
            raise RuntimeError(
                f"rendezvous backend {params.backend!r} was requested but the created "
                f"handler reports backend {actual!r}"
            )
        return handler


#: The process-wide registry used by :func:`register` and :func:`create_handler`.
rendezvous_handler_registry = RendezvousHandlerRegistry()


def register(name: str, creator: HandlerCreator) -> None:
    """Register ``creator`` as backend ``name`` in the process-wide registry."""
    rendezvous_handler_registry.register(name, creator)


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """Create a handler from the process-wide registry."""
    return rendezvous_handler_registry.create_handler(params)
