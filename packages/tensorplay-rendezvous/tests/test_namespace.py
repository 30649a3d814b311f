"""The package layout: namespace packages, re-exports only, the documented module paths."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from pathlib import Path
from types import ModuleType

import pytest

import tensorplay
import tensorplay.distributed
import tensorplay.distributed.elastic
import tensorplay.distributed.elastic.rendezvous
import tp_rdzv_api
import tp_rdzv_api.api
import tp_rdzv_api.registry
import tp_rdzv_api.utils
import tp_rdzv_static.static_tcp_rendezvous
import tp_store

RENDEZVOUS = "tensorplay.distributed.elastic.rendezvous"
#: Each submodule of the documented package and the module it re-exports.
SUBMODULES: dict[str, ModuleType] = {
    "api": tp_rdzv_api.api,
    "static_tcp_rendezvous": tp_rdzv_static.static_tcp_rendezvous,
    "utils": tp_rdzv_api.utils,
    "registry": tp_rdzv_api.registry,
}


@pytest.mark.parametrize("module", [tensorplay, tensorplay.distributed.elastic])
def test_namespace_packages(module: ModuleType) -> None:
    assert getattr(module, "__file__", None) is None, f"{module.__name__} has an __init__.py"
    assert module.__spec__ is not None
    assert module.__spec__.origin in (None, "namespace")
    locations = list(module.__path__)
    assert locations
    for location in locations:
        assert not (Path(location) / "__init__.py").exists()


def test_regular_packages() -> None:
    for module in (tensorplay.distributed, tensorplay.distributed.elastic.rendezvous):
        assert module.__file__ is not None
        assert Path(module.__file__).name == "__init__.py"


def test_distributed_reexports_the_stores() -> None:
    names = ["FileStore", "HashStore", "PrefixStore", "Store", "TCPStore"]
    assert sorted(tensorplay.distributed.__all__) == names
    for name in names:
        assert getattr(tensorplay.distributed, name) is getattr(tp_store, name)


@pytest.mark.parametrize("name", sorted(SUBMODULES))
def test_documented_module_paths(name: str) -> None:
    module = importlib.import_module(f"{RENDEZVOUS}.{name}")
    source = SUBMODULES[name]
    assert module.__all__, f"{module.__name__} re-exports nothing"
    for attribute in module.__all__:
        assert getattr(module, attribute) is getattr(source, attribute), (
            f"{module.__name__}.{attribute} is not {source.__name__}.{attribute}"
        )


def test_module_paths_of_the_seed_source() -> None:
    """The names the seed's static_tcp_rendezvous module imports from its neighbours."""
    from tensorplay.distributed import PrefixStore, TCPStore
    from tensorplay.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousHandler,
        RendezvousInfo,
        RendezvousParameters,
        RendezvousStoreInfo,
    )
    from tensorplay.distributed.elastic.rendezvous.registry import create_handler, register
    from tensorplay.distributed.elastic.rendezvous.static_tcp_rendezvous import (
        StaticTCPRendezvous,
        create_rdzv_handler,
    )
    from tensorplay.distributed.elastic.rendezvous.utils import (
        parse_rendezvous_config,
        parse_rendezvous_endpoint,
    )

    assert issubclass(StaticTCPRendezvous, RendezvousHandler)
    assert all(
        callable(thing)
        for thing in (
            PrefixStore,
            TCPStore,
            RendezvousConnectionError,
            RendezvousInfo,
            RendezvousParameters,
            RendezvousStoreInfo,
            create_handler,
            register,
            create_rdzv_handler,
            parse_rendezvous_config,
            parse_rendezvous_endpoint,
        )
    )


def _distribution() -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution("tensorplay-rendezvous")
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(_distribution() is None, reason="needs tensorplay-rendezvous installed (nox)")
def test_distribution_is_never_named_tensorplay() -> None:
    dist = _distribution()
    assert dist is not None
    assert dist.metadata["Name"] == "tensorplay-rendezvous"
    required = {
        re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()
        for requirement in dist.requires or []
    }
    assert {"tp-store", "tp-rdzv-api", "tp-rdzv-static"} <= required
    assert "tensorplay" not in required
    files = [str(path) for path in dist.files or []]
    namespace_inits = ("tensorplay/__init__.py", "tensorplay/distributed/elastic/__init__.py")
    assert not [path for path in files if path.endswith(namespace_inits)]
