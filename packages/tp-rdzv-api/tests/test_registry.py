"""The handler registry: ``register``, ``create_handler`` and entry-point discovery."""

from __future__ import annotations

import sys
import textwrap
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

import tp_rdzv_api
from tp_rdzv_api import (
    ENTRY_POINT_GROUP,
    RendezvousHandler,
    RendezvousHandlerRegistry,
    RendezvousInfo,
    RendezvousParameters,
)
from tp_rdzv_api import registry as registry_module
from tp_store import HashStore


class FakeHandler(RendezvousHandler):
    """A complete handler that reports whatever backend name it was given."""

    def __init__(self, backend: str, params: RendezvousParameters | None = None) -> None:
        self.backend = backend
        self.params = params

    def get_backend(self) -> str:
        return self.backend

    def get_run_id(self) -> str:
        return "run"

    def is_closed(self) -> bool:
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        return RendezvousInfo(HashStore(), 0, 1)

    def num_nodes_waiting(self) -> int:
        return 0

    def set_closed(self) -> None:
        pass

    def shutdown(self) -> bool:
        return True


def creator_for(backend: str) -> Callable[[RendezvousParameters], RendezvousHandler]:
    def create(params: RendezvousParameters) -> RendezvousHandler:
        return FakeHandler(backend, params)

    return create


def params(backend: str) -> RendezvousParameters:
    return RendezvousParameters(backend, "localhost:1", "run")


@pytest.fixture
def registry() -> RendezvousHandlerRegistry:
    return RendezvousHandlerRegistry(entry_point_group=None)


def test_register_and_create(registry: RendezvousHandlerRegistry) -> None:
    registry.register("mine", creator_for("mine"))
    handler = registry.create_handler(params("mine"))
    assert isinstance(handler, FakeHandler)
    assert handler.get_backend() == "mine"
    assert handler.params is not None
    assert handler.params.backend == "mine"
    assert "mine" in registry
    assert registry.names() == ["mine"]


def test_registering_the_same_creator_again_is_a_no_op(
    registry: RendezvousHandlerRegistry,
) -> None:
    creator = creator_for("mine")
    registry.register("mine", creator)
    registry.register("mine", creator)
    assert registry.get_creator("mine") is creator


class _Plugin:
    def create(self, params: RendezvousParameters) -> RendezvousHandler:
        return FakeHandler("mine", params)


def test_registering_the_same_bound_method_again_is_a_no_op(
    registry: RendezvousHandlerRegistry,
) -> None:
    # Each attribute access makes a new bound-method object; PyTorch compares by equality.
    plugin = _Plugin()
    registry.register("mine", plugin.create)
    registry.register("mine", plugin.create)
    assert registry.get_creator("mine") == plugin.create
    with pytest.raises(ValueError, match="already registered"):
        registry.register("mine", _Plugin().create)


def test_registering_a_different_creator_is_a_value_error(
    registry: RendezvousHandlerRegistry,
) -> None:
    registry.register("mine", creator_for("mine"))
    with pytest.raises(ValueError, match="'mine' is already registered with creator"):
        registry.register("mine", creator_for("mine"))


def test_unknown_backend_lists_the_known_ones_sorted(registry: RendezvousHandlerRegistry) -> None:
    for name in ("static", "core", "etcd"):
        registry.register(name, creator_for(name))
    with pytest.raises(
        ValueError,
        match=r"rendezvous backend 'nope' is not registered; known backends: core, etcd, static$",
    ):
        registry.create_handler(params("nope"))


def test_unknown_backend_in_an_empty_registry(registry: RendezvousHandlerRegistry) -> None:
    with pytest.raises(ValueError, match=r"known backends: \(none\)"):
        registry.create_handler(params("static"))


def test_backend_name_mismatch_is_a_runtime_error(registry: RendezvousHandlerRegistry) -> None:
    registry.register("c10d", creator_for("core"))
    with pytest.raises(
        RuntimeError, match=r"backend 'c10d' was requested but .* reports backend 'core'"
    ):
        registry.create_handler(params("c10d"))


def test_creator_returning_a_non_handler(registry: RendezvousHandlerRegistry) -> None:
    registry.register("odd", lambda _params: object())  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match=r"'odd' returned .*, not a RendezvousHandler"):
        registry.create_handler(params("odd"))


def test_creator_errors_propagate(registry: RendezvousHandlerRegistry) -> None:
    def broken(_params: RendezvousParameters) -> RendezvousHandler:
        raise ValueError("endpoint is absent")

    registry.register("broken", broken)
    with pytest.raises(ValueError, match="endpoint is absent"):
        registry.create_handler(params("broken"))


@pytest.mark.parametrize("name", ["", "  ", " padded", 5])
def test_bad_names(registry: RendezvousHandlerRegistry, name: object) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        registry.register(name, creator_for("x"))  # type: ignore[arg-type]


def test_creator_must_be_callable(registry: RendezvousHandlerRegistry) -> None:
    with pytest.raises(TypeError, match="must be callable"):
        registry.register("x", "module:attr")  # type: ignore[arg-type]


def test_create_handler_needs_parameters(registry: RendezvousHandlerRegistry) -> None:
    with pytest.raises(TypeError, match=r"expected RendezvousParameters .*\(no backend, "):
        registry.create_handler("static")  # type: ignore[arg-type]


def test_create_handler_takes_pytorch_style_parameters(registry: RendezvousHandlerRegistry) -> None:
    # What torchrun hands its creators: PyTorch's RendezvousParameters, read by attribute.
    registry.register("odd", creator_for("odd"))
    foreign = SimpleNamespace(
        backend="odd",
        endpoint="h:1",
        run_id="job",
        min_nodes=1,
        max_nodes=2,
        local_addr=None,
        config={"join_timeout": "7"},
    )
    handler = registry.create_handler(foreign)  # type: ignore[arg-type]
    assert isinstance(handler, FakeHandler)
    assert isinstance(handler.params, RendezvousParameters)
    assert (handler.params.run_id, handler.params.max_nodes) == ("job", 2)
    assert handler.params.timeout.join == timedelta(seconds=7)


def test_concurrent_registration_keeps_one_creator(registry: RendezvousHandlerRegistry) -> None:
    creators = [creator_for("race") for _ in range(16)]
    barrier = threading.Barrier(len(creators))
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt(creator: Callable[[RendezvousParameters], RendezvousHandler]) -> None:
        barrier.wait()
        try:
            registry.register("race", creator)
            result = "ok"
        except ValueError:
            result = "rejected"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=attempt, args=(c,)) for c in creators]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ok"] + ["rejected"] * 15
    assert registry.get_creator("race") in creators


# -- the process-wide registry ------------------------------------------------------


def test_module_level_functions_use_the_default_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh = RendezvousHandlerRegistry(entry_point_group=None)
    monkeypatch.setattr(registry_module, "rendezvous_handler_registry", fresh)
    tp_rdzv_api.register("mine", creator_for("mine"))
    assert fresh.names() == ["mine"]
    assert tp_rdzv_api.create_handler(params("mine")).get_backend() == "mine"


def test_default_registry_reads_the_documented_group() -> None:
    assert ENTRY_POINT_GROUP == "tensorplay.rendezvous.handlers"
    assert registry_module.rendezvous_handler_registry.entry_point_group == ENTRY_POINT_GROUP


# -- entry points ----------------------------------------------------------------------


class FakeDistribution:
    """A distribution on ``sys.path`` (a ``.dist-info`` folder) declaring entry points."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.group = f"tp-rdzv-api-tests.{uuid.uuid4().hex}"
        self.monkeypatch = monkeypatch
        monkeypatch.syspath_prepend(str(root))

    def module(self, source: str) -> str:
        """Write a module; return its (unique) name."""
        name = f"fake_backend_{uuid.uuid4().hex}"
        (self.root / f"{name}.py").write_text(source)
        self.monkeypatch.delitem(sys.modules, name, raising=False)
        return name

    def declare(self, dist: str, entries: dict[str, str]) -> None:
        # Folder names escape '-' as '_' (importlib.metadata splits the name at '-').
        info = self.root / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        lines = "".join(f"{name} = {value}\n" for name, value in entries.items())
        (info / "entry_points.txt").write_text(f"[{self.group}]\n{lines}")


HANDLER_MODULE = textwrap.dedent(
    """
    from tp_rdzv_api import RendezvousHandler, RendezvousInfo
    from tp_store import HashStore

    LOADS = []

    class Handler(RendezvousHandler):
        def __init__(self, params):
            self.params = params
        def get_backend(self): return self.params.backend
        def get_run_id(self): return self.params.run_id
        def is_closed(self): return False
        def next_rendezvous(self): return RendezvousInfo(HashStore(), 0, 1)
        def num_nodes_waiting(self): return 0
        def set_closed(self): pass
        def shutdown(self): return True

    def create_handler(params):
        return Handler(params)

    LOADS.append(1)
    """
)


@pytest.fixture
def dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeDistribution:
    return FakeDistribution(tmp_path, monkeypatch)


def test_entry_points_are_discovered_and_loaded_lazily(dist: FakeDistribution) -> None:
    module = dist.module(HANDLER_MODULE)
    dist.declare("fake-backends", {"alpha": f"{module}:create_handler", "beta": "missing:x"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    assert registry.names() == ["alpha", "beta"]
    assert module not in sys.modules  # listing names imports nothing
    handler = registry.create_handler(params("alpha"))
    assert handler.get_backend() == "alpha"
    assert type(handler).__module__ == module
    registry.create_handler(params("alpha"))
    assert sys.modules[module].LOADS == [1]


def test_entry_points_and_registrations_are_listed_together(dist: FakeDistribution) -> None:
    dist.declare("fake-backends", {"zeta": "somewhere:create"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    registry.register("alpha", creator_for("alpha"))
    with pytest.raises(ValueError, match=r"known backends: alpha, zeta$"):
        registry.create_handler(params("gamma"))


def test_an_entry_point_that_cannot_be_loaded(dist: FakeDistribution) -> None:
    dist.declare("fake-backends", {"ghost": "no_such_module_anywhere:create"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    with pytest.raises(RuntimeError, match="cannot load rendezvous backend 'ghost'") as info:
        registry.create_handler(params("ghost"))
    assert isinstance(info.value.__cause__, ImportError)


def test_an_entry_point_that_is_not_callable(dist: FakeDistribution) -> None:
    module = dist.module("NOT_A_CREATOR = 42\n")
    dist.declare("fake-backends", {"num": f"{module}:NOT_A_CREATOR"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    with pytest.raises(RuntimeError, match="is not callable"):
        registry.create_handler(params("num"))


def test_registering_the_entry_points_own_creator_is_fine(dist: FakeDistribution) -> None:
    module = dist.module(HANDLER_MODULE)
    dist.declare("fake-backends", {"alpha": f"{module}:create_handler"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    loaded = registry.get_creator("alpha")
    registry.register("alpha", loaded)
    assert registry.create_handler(params("alpha")).get_backend() == "alpha"


def test_registration_conflicting_with_a_loaded_entry_point(dist: FakeDistribution) -> None:
    module = dist.module(HANDLER_MODULE)
    dist.declare("fake-backends", {"alpha": f"{module}:create_handler"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    registry.get_creator("alpha")
    with pytest.raises(ValueError, match="'alpha' is already registered"):
        registry.register("alpha", creator_for("alpha"))


def test_registration_conflicting_with_an_unloaded_entry_point(dist: FakeDistribution) -> None:
    module = dist.module(HANDLER_MODULE)
    dist.declare("fake-backends", {"alpha": f"{module}:create_handler"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    registry.register("alpha", creator_for("alpha"))
    with pytest.raises(ValueError, match="'alpha' has conflicting creators: register") as info:
        registry.create_handler(params("alpha"))
    assert f"entry point '{module}:create_handler'" in str(info.value)


def test_duplicate_entry_points_with_the_same_target(dist: FakeDistribution) -> None:
    module = dist.module(HANDLER_MODULE)
    dist.declare("fake-backends", {"alpha": f"{module}:create_handler"})
    dist.declare("fake-backends-copy", {"alpha": f"{module}:create_handler"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    assert registry.create_handler(params("alpha")).get_backend() == "alpha"


def test_entry_points_with_different_targets_conflict(dist: FakeDistribution) -> None:
    first = dist.module(HANDLER_MODULE)
    second = dist.module(HANDLER_MODULE)
    dist.declare("fake-one", {"alpha": f"{first}:create_handler"})
    dist.declare("fake-two", {"alpha": f"{second}:create_handler"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    with pytest.raises(ValueError, match="'alpha' has conflicting creators"):
        registry.create_handler(params("alpha"))


def test_a_module_that_registers_itself_on_import(dist: FakeDistribution) -> None:
    """A backend module may both declare its entry point and call register() on import."""
    module = dist.module(
        HANDLER_MODULE
        + "\nfrom tp_rdzv_api import registry as _registry\n"
        + "_registry.rendezvous_handler_registry.register('alpha', create_handler)\n"
    )
    dist.declare("fake-backends", {"alpha": f"{module}:create_handler"})
    registry = RendezvousHandlerRegistry(entry_point_group=dist.group)
    original = registry_module.rendezvous_handler_registry
    registry_module.rendezvous_handler_registry = registry
    try:
        assert registry.create_handler(params("alpha")).get_backend() == "alpha"
    finally:
        registry_module.rendezvous_handler_registry = original
