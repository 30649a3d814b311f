"""The registry creators: backends core, c10d and p10d, their config keys and stores."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import pytest

from tp_rdzv_api import (
    RendezvousConnectionError,
    RendezvousParameters,
    create_handler,
    rendezvous_handler_registry,
)
from tp_rdzv_api.testing import config_key_warnings
from tp_rdzv_dynamic import DynamicRendezvousHandler, P10dRendezvousBackend, TpRendezvousBackend
from tp_rdzv_dynamic.factory import create_store, is_local_address, settings_from
from tp_store import FileStore, TCPStore


def params(backend: str, endpoint: str, **config: object) -> RendezvousParameters:
    config.setdefault("last_call_timeout", 0.1)
    return RendezvousParameters(
        backend, endpoint, "job", min_nodes=1, max_nodes=2, local_addr="127.0.0.1", config=config
    )


@pytest.mark.parametrize(
    ("name", "backend_type"),
    [("core", TpRendezvousBackend), ("c10d", TpRendezvousBackend), ("p10d", P10dRendezvousBackend)],
)
def test_registered_backends(free_port, name, backend_type):
    assert name in rendezvous_handler_registry
    handler = create_handler(params(name, f"127.0.0.1:{free_port}", is_host=True))
    assert isinstance(handler, DynamicRendezvousHandler)
    assert handler.get_backend() == name
    assert isinstance(handler._holder.backend, backend_type)
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    # The workers' store is a server of its own, not the rendezvous store.
    assert info.bootstrap_store_info.port != free_port
    worker = TCPStore("127.0.0.1", info.bootstrap_store_info.port, timeout=5)
    assert worker.num_keys() == 0
    worker.close()
    handler.shutdown()


def test_the_host_serves_and_the_others_connect(free_port):
    host = create_handler(params("core", f"127.0.0.1:{free_port}", is_host="true"))
    guest = create_handler(params("core", f"127.0.0.1:{free_port}", is_host="false"))
    assert host._store.server is not None
    assert guest._store.server is None
    host.shutdown()


def test_a_local_address_hosts_unless_someone_already_does(free_port):
    first = create_store(params("core", f"127.0.0.1:{free_port}"))
    second = create_store(params("core", f"127.0.0.1:{free_port}"))
    assert isinstance(first, TCPStore)
    assert first.server is not None
    assert isinstance(second, TCPStore)
    second.set("k", "v")
    assert first.get("k") == b"v"
    first.close()


def test_explicit_host_that_cannot_bind_is_an_error(free_port):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port))
        taken.listen()
        # Another process owns the port: hosting was asked for, so no fallback.
        with pytest.raises(RendezvousConnectionError, match=f"127.0.0.1:{free_port}"):
            create_store(params("core", f"127.0.0.1:{free_port}", is_host=True))


def test_unreachable_store_is_a_connection_error(free_port):
    with pytest.raises(RendezvousConnectionError, match=f"127.0.0.1:{free_port}"):
        create_store(params("core", f"127.0.0.1:{free_port}", is_host=False, read_timeout=0.5))


def test_file_store(tmp_path):
    path = tmp_path / "rdzv"
    store = create_store(params("core", str(path), store_type="file"))
    assert isinstance(store, FileStore)
    handler = create_handler(params("core", str(path), store_type="FILE"))
    info = handler.next_rendezvous()
    assert info.world_size == 1
    assert info.bootstrap_store_info is not None
    handler.shutdown()


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"store_type": "redis"}, "store_type"),
        ({"read_timeout": "soon"}, "read_timeout"),
        ({"read_timeout": 0}, "read_timeout"),
        ({"keep_alive_interval": "-1"}, "keep_alive_interval"),
        ({"keep_alive_max_attempt": "0"}, "keep_alive_max_attempt"),
        ({"keep_alive_max_attempt": "many"}, "keep_alive_max_attempt"),
        ({"join_timeout": "x"}, "join_timeout"),
        ({"is_host": "maybe"}, "is_host"),
        ({"stable_ranks": "sometimes"}, "stable_ranks"),
    ],
)
def test_bad_config_is_named(free_port, config, match):
    with pytest.raises(ValueError, match=match):
        create_handler(params("core", f"127.0.0.1:{free_port}", **config))


@pytest.mark.parametrize("endpoint", ["", " "])
def test_file_store_without_a_path_is_a_new_temporary_file(tmp_path, monkeypatch, endpoint):
    # As PyTorch: one node on a private file (mkstemp: this user only).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    store = create_store(params("core", endpoint, store_type="file"))
    assert isinstance(store, FileStore)
    path = Path(store.path)
    assert path.parent == tmp_path
    assert path.stat().st_mode & 0o077 == 0
    store.set("k", "v")
    assert FileStore(path).get("k") == b"v"
    other = create_store(params("core", endpoint, store_type="file"))
    assert isinstance(other, FileStore)
    assert other.path != store.path


@pytest.mark.parametrize("where", ["missing-dir/rdzv", "."])
def test_file_store_that_cannot_open_is_a_connection_error(tmp_path, where):
    # A missing directory (FileNotFoundError), a directory (IsADirectoryError).
    path = tmp_path / where
    with pytest.raises(RendezvousConnectionError, match="cannot open the rendezvous file store"):
        create_handler(params("core", str(path), store_type="file"))


def test_file_store_timeout_is_pytorchs_300_s_unless_read_timeout_says(tmp_path):
    path = str(tmp_path / "rdzv")
    assert create_store(params("core", path, store_type="file")).timeout.total_seconds() == 300
    store = create_store(params("core", path, store_type="file", read_timeout="7"))
    assert store.timeout.total_seconds() == 7


def test_settings_from_config_strings():
    settings = settings_from(
        params(
            "core",
            "h:1",
            join_timeout="12",
            last_call_timeout="1.5",
            keep_alive_interval="2",
            keep_alive_max_attempt="4",
        )
    )
    assert settings.timeout.join.total_seconds() == 12
    assert settings.timeout.last_call.total_seconds() == 1.5
    assert settings.keep_alive_interval.total_seconds() == 2
    assert settings.keep_alive_max_attempt == 4
    assert (settings.min_nodes, settings.max_nodes, settings.run_id) == (1, 2, "job")
    assert settings.stable_ranks is False  # today's order unless asked


@pytest.mark.parametrize(("given", "stable"), [("1", True), ("True", True), ("no", False)])
def test_stable_ranks_from_config_strings(given, stable):
    assert settings_from(params("core", "h:1", stable_ranks=given)).stable_ranks is stable


@pytest.mark.parametrize(
    ("host", "local"), [("127.0.0.1", True), ("localhost", True), ("192.0.2.1", False)]
)
def test_is_local_address(host, local):
    assert is_local_address(host) is local


@pytest.mark.parametrize("config", [{"is_host": True}, {"is_host": False, "read_timeout": 30}])
def test_the_run_id_is_checked_before_any_store_is_hosted_or_reached(config):
    # Port taken by a plain listener: hosting would fail, and reaching it would
    # wait for a store handshake that never comes; neither may happen first.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        endpoint = f"127.0.0.1:{taken.getsockname()[1]}"
        bad = RendezvousParameters("core", endpoint, "job 1", config=config)
        with pytest.raises(ValueError, match="run_id must be a non-empty string of letters"):
            create_handler(bad)


def test_the_run_id_is_checked_before_a_file_store_is_created(tmp_path):
    path = tmp_path / "store"
    bad = RendezvousParameters("core", str(path), "../job", config={"store_type": "file"})
    with pytest.raises(ValueError, match="run_id"):
        create_handler(bad)
    assert not path.exists()


def test_a_liveness_bound_too_long_for_a_timedelta_names_the_options():
    huge = params("core", "127.0.0.1:1", keep_alive_max_attempt=str(10**30))
    with pytest.raises(ValueError, match="keep_alive_interval x keep_alive_max_attempt"):
        settings_from(huge)


def torchrun_params(endpoint: str, **config: object) -> SimpleNamespace:
    """PyTorch's RendezvousParameters as torchrun fills them: attributes, strings, its timeout."""
    return SimpleNamespace(
        backend="tp",
        endpoint=endpoint,
        run_id="job",
        min_nodes=2,
        max_nodes=2,
        local_addr="127.0.0.1",
        config={"timeout": 900, "last_call_timeout": "0.1", **config},
    )


def test_the_torchrun_plugin_is_backend_core_named_tp(free_port, caplog):
    caplog.set_level(logging.WARNING)
    (entry,) = entry_points(group="torchrun.handlers", name="tp")
    # torchrun calls the entry point and registers what it returns; twice gives one creator.
    creator = entry.load()()
    assert creator is entry.load()()
    endpoint = f"127.0.0.1:{free_port}"
    host = creator(torchrun_params(endpoint, is_host="1", keep_alive_interval="1"))
    guest = creator(torchrun_params(endpoint, is_host="0", join_timeout="30", stable_ranks="true"))
    assert (host.get_backend(), guest.get_backend()) == ("tp", "tp")
    assert host._store.server is not None
    assert guest._store.server is None
    assert host.settings.keep_alive_interval == timedelta(seconds=1)
    assert guest.settings.timeout.join == timedelta(seconds=30)
    # --rdzv-conf stable_ranks=true reaches the settings the steward decides by.
    assert (host.settings.stable_ranks, guest.settings.stable_ranks) == (False, True)
    with ThreadPoolExecutor(2) as pool:
        infos = list(pool.map(lambda handler: handler.next_rendezvous(), [host, guest]))
    assert sorted(info.rank for info in infos) == [0, 1]
    assert config_key_warnings(caplog.records) == []
    guest.shutdown()
    host.shutdown()


def test_the_torchrun_plugin_names_a_bad_key(free_port):
    (entry,) = entry_points(group="torchrun.handlers", name="tp")
    with pytest.raises(ValueError, match="keep_alive_max_attempt"):
        entry.load()()(torchrun_params(f"127.0.0.1:{free_port}", keep_alive_max_attempt="0"))


def test_a_file_store_path_the_os_refuses_is_a_connection_error():
    # The OS refuses a path with a NUL byte with ValueError, not OSError.
    with pytest.raises(RendezvousConnectionError, match="cannot open the rendezvous file store"):
        create_store(params("core", "/tmp/tp-rdzv\x00job", store_type="file"))


# A process that may start no thread: hosting the store needs its server thread,
# and threading raises a plain RuntimeError ("can't start new thread").
NO_THREADS_LEFT = """
import os, resource, sys
from tp_rdzv_api import RendezvousConnectionError, RendezvousParameters
from tp_rdzv_dynamic.factory import create_store

if os.getuid() == 0:  # root ignores RLIMIT_NPROC: run as nobody
    os.setgid(65534)
    os.setuid(65534)
resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
params = RendezvousParameters(
    "core", "127.0.0.1:" + sys.argv[1], "job", 1, 1, config={"is_host": True}
)
try:
    create_store(params)
except RendezvousConnectionError as exc:
    print("connection error:", exc)
"""


def test_a_runtime_error_from_the_store_constructor_is_a_connection_error(free_port):
    done = subprocess.run(
        [sys.executable, "-c", NO_THREADS_LEFT, str(free_port)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("connection error: cannot host the rendezvous store"), done.stdout
