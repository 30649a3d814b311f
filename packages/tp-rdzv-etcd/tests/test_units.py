"""Endpoint parsing, the key layout and the factory's checks: no etcd needed."""

from __future__ import annotations

import http.server
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_etcd import EtcdStore, parse_endpoints
from tp_rdzv_etcd.endpoints import Endpoint
from tp_rdzv_etcd.factory import PASSWORD_ENV, USER_ENV, create_store
from tp_rdzv_etcd.layout import KeyLayout, escape, range_end, unescape
from tp_store import StoreError


def test_endpoints_take_urls_and_host_ports() -> None:
    assert parse_endpoints("a:1, http://b:2,https://[::1]:3 ,c") == (
        Endpoint("http", "a", 1),
        Endpoint("http", "b", 2),
        Endpoint("https", "::1", 3),
        Endpoint("http", "c", 2379),
    )
    assert parse_endpoints(["a"], "https")[0].url == "https://a:2379"
    assert Endpoint("https", "::1", 3).url == "https://[::1]:3"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "no etcd endpoint"),
        (" , ", "no etcd endpoint"),
        ("ftp://a:1", "scheme"),
        ("a:notaport", "port"),
        ("http://a:1/path", "path"),
    ],
)
def test_bad_endpoints_are_rejected(bad: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_endpoints(bad)


@given(st.binary())
def test_escaping_round_trips_and_removes_slashes(key: bytes) -> None:
    assert b"/" not in escape(key)
    assert unescape(escape(key)) == key


@given(st.binary(), st.binary())
def test_one_keys_range_never_holds_anothers(a: bytes, b: bytes) -> None:
    layout = KeyLayout(b"/p/")
    if a != b:
        assert not layout.home(b).startswith(layout.home(a))
    assert layout.store_key(layout.value(a)) == a
    assert layout.store_key(layout.new_queue_item(a)) is None


def test_range_end_covers_a_prefix() -> None:
    assert range_end(b"/a/") == b"/a0"
    assert range_end(b"a\xff") == b"b"


def _params(**config: Any) -> RendezvousParameters:
    return RendezvousParameters("etcd", "127.0.0.1:2379", "run", 1, 2, **config)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"protocol": "gopher"}, "protocol"),
        ({"etcd_prefix": "/"}, "etcd_prefix"),
        ({"cacert": "/no/such/file"}, "cacert"),
        ({"read_timeout": "soon"}, "read_timeout"),
        ({"lease_transport": "pigeon"}, "lease_transport"),
        ({"keep_alive_max_attempt": 0}, "keep_alive_max_attempt"),
    ],
)
def test_bad_config_names_the_key(config: dict[str, object], named: str) -> None:
    from tp_rdzv_etcd.factory import create_handler

    with pytest.raises(ValueError, match=named):
        create_handler(_params(**config))


def test_credentials_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(USER_ENV, "alice")
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(ValueError, match=PASSWORD_ENV):
        create_store(_params())
    monkeypatch.setenv(PASSWORD_ENV, "secret")
    store = create_store(_params(etcd_prefix="/jobs/"))
    assert store.prefix == b"/jobs/run/"
    assert store.endpoints == ("http://127.0.0.1:2379",)
    assert store.endpoint == "http://127.0.0.1:2379/jobs/run/"  # what nodes share a session on
    store.close()


@pytest.mark.parametrize(
    ("config", "on_stream"), [({}, True), ({"lease_transport": "gateway"}, False)]
)
def test_lease_transport_chooses_the_keep_alives_stream(
    config: dict[str, object], on_stream: bool
) -> None:
    store = create_store(_params(**config))
    assert (store._lease_keeper is not None) == on_stream
    store.close()


def test_etcd_users_keep_their_leases_alive_through_the_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(USER_ENV, "alice")
    monkeypatch.setenv(PASSWORD_ENV, "secret")
    store = create_store(_params())
    assert store._lease_keeper is None  # gRPC would need the token as well
    store.close()


def test_store_rejects_half_configurations() -> None:
    with pytest.raises(ValueError, match="prefix"):
        EtcdStore("a", "")
    with pytest.raises(ValueError, match="cert"):
        EtcdStore("a", cert="c.pem")
    with pytest.raises(ValueError, match="password"):
        EtcdStore("a", user="alice")


class _DeepJsonHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request with deeply nested JSON, as no etcd member would."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b"[" * 100_000
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def test_deeply_nested_json_in_place_of_etcd_is_a_store_error() -> None:
    # Over plain http anyone on the path may answer in etcd's place.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DeepJsonHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with EtcdStore(f"127.0.0.1:{server.server_port}", "/p/", timeout=5) as store:
            with pytest.raises(StoreError, match="non-JSON"):
                store.set("k", "v")
            with pytest.raises(StoreError, match="non-JSON"):
                store.check(["k"])
    finally:
        server.shutdown()
        server.server_close()
