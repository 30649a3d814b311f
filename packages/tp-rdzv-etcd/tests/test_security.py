"""``EtcdStore`` and the ``etcd`` backend against etcd with TLS and authentication on.

Certificates are made at test time with the ``openssl`` command (Debian's
``openssl`` package, on every CI image): a throwaway CA, a server certificate
for ``127.0.0.1``/``localhost`` and a client certificate. The command rather
than the ``cryptography`` package: nothing to add to the test extra, and the
tool an operator would use. Authentication is
switched on through the members' JSON gateway (``/v3/auth/...``), as an
operator's ``etcdctl`` would, so nothing beyond the etcd server is needed.
Without ``openssl`` (or etcd) these tests are skipped, except under
``CI=true``, where they fail.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import urllib3

from tp_rdzv_api import RendezvousParameters, create_handler
from tp_rdzv_api.info import RendezvousInfo
from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.factory import PASSWORD_ENV, USER_ENV
from tp_rdzv_etcd.layout import range_end
from tp_rdzv_etcd.local import EtcdMember, EtcdTls, LocalEtcd
from tp_store import StoreConnectionError, StoreError

pytestmark = pytest.mark.etcd

ROOT_PASSWORD = "root-secret"
USER = "rdzv"
PASSWORD = "rdzv-secret"
#: The etcd prefix the user ``rdzv`` may read and write; the store prefixes are under it.
RUN_PREFIX = "/runs/"
#: "Fails fast": well under the stores' 30 s timeout, with room for a slow CI machine.
FAST = 5.0


# -- certificates ----------------------------------------------------------------------
@dataclass(frozen=True)
class Pki:
    """PEM files of a throwaway PKI (keys unencrypted: tests only)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    jwt_key: Path  # an RSA key pair that signs etcd's JWT auth tokens
    jwt_public: Path


def _openssl(directory: Path, *args: str) -> None:
    done = subprocess.run(
        ["openssl", *args], cwd=directory, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")


def _leaf(directory: Path, name: str, subject: str, extensions: str) -> None:
    """A P-256 key ``<name>.key`` and its certificate ``<name>.pem``, signed by ``ca``."""
    _openssl(
        directory,
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
    )  # fmt: skip
    (directory / f"{name}.ext").write_text(extensions)
    _openssl(
        directory,
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
    )  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a server and a client certificate it signed, and a JWT signing key.

    The certificates have EC P-256 keys: made in milliseconds, unlike RSA
    keys (only the JWT key must be RSA). The server certificate allows client
    authentication too: with client certificates required, etcd 3.4's JSON
    gateway presents it to its own gRPC server.
    """
    if shutil.which("openssl") is None:
        message = "no openssl command: install the Debian package openssl"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {message}")
        pytest.skip(message)
    directory = tmp_path_factory.mktemp("pki")
    _openssl(
        directory,
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=tp-rdzv-etcd test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    usage = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
    _leaf(
        directory,
        "server",
        "/CN=tp-rdzv-etcd test server",
        usage + "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    # No CommonName: with authentication on, etcd's gateway refuses client
    # certificates that have one (it could not pass the name on as the user).
    _leaf(
        directory, "client", "/O=tp-rdzv-etcd test client", usage + "extendedKeyUsage=clientAuth\n"
    )
    # etcd 3.4 signs JWT tokens with RSA (RS256) keys.
    _openssl(directory, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", "jwt.key")  # fmt: skip
    _openssl(directory, "pkey", "-in", "jwt.key", "-pubout", "-out", "jwt.pub")
    return Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        jwt_key=directory / "jwt.key",
        jwt_public=directory / "jwt.pub",
    )


# -- etcd administration through the JSON gateway ------------------------------------------
def _b64(data: str) -> str:
    return base64.b64encode(data.encode()).decode()


class Admin:
    """An etcd operator talking to a member's JSON gateway (what ``etcdctl`` would do)."""

    def __init__(self, etcd: LocalEtcd, pki: Pki | None = None) -> None:
        self.url = etcd.members[0].client_url
        self._http = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED",
            ca_certs=None if pki is None else str(pki.ca),
            # With client certificates required, the operator presents one too.
            cert_file=None if pki is None else str(pki.client_cert),
            key_file=None if pki is None else str(pki.client_key),
            timeout=10.0,
            retries=False,
        )
        self._token: str | None = None

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST ``body`` (as root once auth is on); the answer, which must be a success.

        root's token expires after ``TOKEN_TTL`` seconds unused, as every
        token of these members does: then root logs in again.
        """
        response = self._request(path, body)
        if response.status == 401 and self._token is not None:
            self._login()
            response = self._request(path, body)
        assert response.status == 200, f"{path}: {response.status} {response.data[:300]!r}"
        answer: dict[str, Any] = json.loads(response.data)
        return answer

    def add_user(self, name: str, password: str, role: str) -> None:
        """A user with one role."""
        self.post("/v3/auth/user/add", {"name": name, "password": password})
        self.post("/v3/auth/user/grant", {"user": name, "role": role})

    def enable_auth(self) -> None:
        """Users root and ``USER`` (read-write on ``RUN_PREFIX`` only), then auth on."""
        self.post("/v3/auth/role/add", {"name": "root"})
        self.add_user("root", ROOT_PASSWORD, "root")
        self.post("/v3/auth/role/add", {"name": USER})
        permission = {
            "permType": "READWRITE",
            "key": _b64(RUN_PREFIX),
            "range_end": base64.b64encode(range_end(RUN_PREFIX.encode())).decode(),
        }
        self.post("/v3/auth/role/grant", {"name": USER, "perm": permission})
        self.add_user(USER, PASSWORD, USER)
        self.post("/v3/auth/enable")
        self._login()

    def _login(self) -> None:
        self._token = None
        token = self.post("/v3/auth/authenticate", {"name": "root", "password": ROOT_PASSWORD})
        self._token = token["token"]

    def _request(self, path: str, body: dict[str, Any] | None) -> urllib3.BaseHTTPResponse:
        headers = {"Content-Type": "application/json"}
        if self._token is not None:
            headers["Authorization"] = self._token
        return self._http.request(
            "POST", self.url + path, body=json.dumps(body or {}).encode(), headers=headers
        )


# -- clusters ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def launch(etcd_binary: str) -> Iterator[Callable[..., LocalEtcd]]:
    """Start one-member clusters (``LocalEtcd`` keyword arguments); all stop after the module."""
    started: list[LocalEtcd] = []

    def start(**options: Any) -> LocalEtcd:
        etcd = LocalEtcd(binary=etcd_binary, **options)
        started.append(etcd)
        return etcd.start()

    yield start
    for etcd in started:
        etcd.stop()


@pytest.fixture(scope="module")
def tls_etcd(launch: Callable[..., LocalEtcd], pki: Pki) -> LocalEtcd:
    """A member serving clients over https."""
    return launch(tls=EtcdTls(pki.server_cert, pki.server_key))


@pytest.fixture(scope="module")
def mtls_etcd(launch: Callable[..., LocalEtcd], pki: Pki) -> LocalEtcd:
    """A member serving https to clients with a certificate signed by the test CA only."""
    return launch(tls=EtcdTls(pki.server_cert, pki.server_key, client_ca=pki.ca))


#: Simple tokens expire after this many seconds unused (etcd's default: 300).
TOKEN_TTL = 2


@pytest.fixture(scope="module")
def auth_etcd(launch: Callable[..., LocalEtcd]) -> tuple[LocalEtcd, Admin]:
    """A plain (http) member with authentication on, and its operator."""
    etcd = launch(extra_args=["--auth-token=simple", f"--auth-token-ttl={TOKEN_TTL}"])
    admin = Admin(etcd)
    admin.enable_auth()
    return etcd, admin


def _prefix() -> str:
    return f"{RUN_PREFIX}{uuid.uuid4().hex}/"


def _watch_opened(store: EtcdStore) -> threading.Event:
    """An event set once ``store``'s waiter has read and goes on to watch (from the
    revision after its read: a write from then on wakes it)."""
    opened = threading.Event()
    rpc = store._rpc  # over gRPC the wait starts a shared watch; else a watch of its own
    target, name = (store._transport, "first_events") if rpc is None else (rpc, "start_watch")
    start = getattr(target, name)

    def watching(*args: Any, **kwargs: Any) -> Any:
        opened.set()
        return start(*args, **kwargs)

    setattr(target, name, watching)
    return opened


def _exercise(store: EtcdStore) -> None:
    """set/get, add, compare_set, and a wait that blocks in a watch until a write."""
    store.set("k", "v")
    assert store.get("k") == b"v"
    assert store.add("n", 2) == 2
    assert store.add("n", 3) == 5
    assert store.compare_set("k", "v", "w") == b"w"
    assert store.compare_set("k", "v", "x") == b"w"
    store.queue_push("q", "item")
    assert store.queue_pop("q") == b"item"
    opened = _watch_opened(store)
    got: list[bytes] = []
    waiter = threading.Thread(target=lambda: got.append(store.wait_get("late", 20)))
    waiter.start()
    assert opened.wait(20), "the waiter never watched"
    with store.clone() as writer:
        writer.set("late", "here")
    waiter.join(20)
    assert got == [b"here"]
    store.wait(["k", "n", "late"], 5)


# -- TLS -----------------------------------------------------------------------------------
def test_https_with_the_ca_works(tls_etcd: LocalEtcd, pki: Pki) -> None:
    assert tls_etcd.endpoints.startswith("https://127.0.0.1:")
    with EtcdStore(tls_etcd.endpoints, _prefix(), timeout=30, cacert=str(pki.ca)) as store:
        _exercise(store)
    assert tls_etcd.leader() is tls_etcd.members[0]  # LocalEtcd's own status calls, over https


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_https_by_host_and_port_uses_the_protocol(tls_etcd: LocalEtcd, pki: Pki, host: str) -> None:
    endpoint = f"{host}:{tls_etcd.members[0].client_port}"
    with EtcdStore(endpoint, _prefix(), timeout=30, protocol="https", cacert=str(pki.ca)) as store:
        store.set("k", "v")
        assert store.get("k") == b"v"


def test_https_without_the_ca_fails_fast_on_verification(tls_etcd: LocalEtcd) -> None:
    # The system's CAs did not sign the test server's certificate.
    with EtcdStore(tls_etcd.endpoints, _prefix(), timeout=30) as store:
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match="certificate verify failed"):
            store.set("k", "v")
        assert time.monotonic() - started < FAST


def test_http_to_an_https_member_fails_fast(tls_etcd: LocalEtcd) -> None:
    endpoint = f"http://127.0.0.1:{tls_etcd.members[0].client_port}"
    with EtcdStore(endpoint, _prefix(), timeout=30) as store:
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match="protocol https"):
            store.set("k", "v")
        assert time.monotonic() - started < FAST


def test_client_certificates_when_required(mtls_etcd: LocalEtcd, pki: Pki) -> None:
    with EtcdStore(
        mtls_etcd.endpoints,
        _prefix(),
        timeout=30,
        cacert=str(pki.ca),
        cert=str(pki.client_cert),
        key=str(pki.client_key),
    ) as store:
        _exercise(store)
    assert mtls_etcd.leader() is mtls_etcd.members[0]


def test_sessions_keep_alive_on_the_grpc_stream_with_client_certificates(
    mtls_etcd: LocalEtcd, pki: Pki
) -> None:
    with EtcdStore(
        mtls_etcd.endpoints,
        _prefix(),
        timeout=30,
        cacert=str(pki.ca),
        cert=str(pki.client_cert),
        key=str(pki.client_key),
    ) as store:
        assert store._lease_keeper is not None  # the gRPC stream, over TLS
        # A TTL this short: every keep-alive waits for its answer on the stream.
        session = store.open_session(4)
        session.set("present/a", "token")
        for _ in range(3):
            session.keep_alive()
        assert not session.ended
        session.close()
        assert not store.check(["present/a"])


def test_no_client_certificate_is_refused_fast(mtls_etcd: LocalEtcd, pki: Pki) -> None:
    with EtcdStore(mtls_etcd.endpoints, _prefix(), timeout=30, cacert=str(pki.ca)) as store:
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match="require a client certificate"):
            store.set("k", "v")
        assert time.monotonic() - started < FAST


# -- users and passwords -------------------------------------------------------------------
def test_user_and_password(auth_etcd: tuple[LocalEtcd, Admin]) -> None:
    etcd, _ = auth_etcd
    with EtcdStore(etcd.endpoints, _prefix(), timeout=30, user=USER, password=PASSWORD) as store:
        _exercise(store)


def test_a_wrong_password_fails_fast_naming_authentication(
    auth_etcd: tuple[LocalEtcd, Admin],
) -> None:
    etcd, _ = auth_etcd
    with EtcdStore(etcd.endpoints, _prefix(), timeout=30, user=USER, password="wrong") as store:
        started = time.monotonic()
        with pytest.raises(StoreConnectionError, match=f"authentication of user '{USER}' failed"):
            store.get("k")
        assert time.monotonic() - started < FAST


def test_no_credentials_are_refused(auth_etcd: tuple[LocalEtcd, Admin]) -> None:
    etcd, _ = auth_etcd
    store = EtcdStore(etcd.endpoints, _prefix(), timeout=30)
    with store, pytest.raises(StoreError, match="user name is empty"):
        store.set("k", "v")


def test_outside_the_granted_prefix_is_refused(auth_etcd: tuple[LocalEtcd, Admin]) -> None:
    etcd, _ = auth_etcd
    store = EtcdStore(etcd.endpoints, "/elsewhere/", timeout=30, user=USER, password=PASSWORD)
    with store, pytest.raises(StoreError, match="permission denied"):
        store.set("k", "v")


def _deleted_token(member: EtcdMember, user: str) -> str:
    """The token of ``user`` that etcd reports it let expire, waiting for that."""
    line = member.wait_for_log('"deleted a simple token"', f'"user-name":"{user}"', timeout=30)
    assert line is not None, f"no token of {user!r} expired"
    token = json.loads(line)["token"]
    assert isinstance(token, str)
    return token


def test_tokens_are_renewed_after_they_expire(auth_etcd: tuple[LocalEtcd, Admin]) -> None:
    etcd, admin = auth_etcd
    (member,) = etcd.members
    # A user of this test's own, so that the token that expires is this store's.
    user = f"expiry-{uuid.uuid4().hex[:8]}"
    admin.add_user(user, PASSWORD, USER)
    with EtcdStore(etcd.endpoints, _prefix(), timeout=30, user=user, password=PASSWORD) as store:
        store.set("k", "v")
        got: list[bytes] = []
        waiter = threading.Thread(target=lambda: got.append(store.wait_get("late", 30)))
        waiter.start()
        # The watch used the token last; it expires while the wait goes on.
        expired = _deleted_token(member, user)
        with store.clone() as writer:
            writer.set("late", "here")
        waiter.join(30)
        assert got == [b"here"], "a watch did not outlive its token"
        # The next request presents the expired token, is refused, authenticates again.
        assert store.add("n", 1) == 1
        refused = member.wait_for_log('"invalid auth token"', expired, timeout=5)
        assert refused is not None, "the store never presented its expired token"
        assert store.compare_set("k", "v", "w") == b"w"


def test_jwt_tokens_are_renewed_when_permissions_change(
    launch: Callable[..., LocalEtcd], pki: Pki
) -> None:
    # A JWT token carries the auth revision it was issued at: once users,
    # roles or permissions change, etcd refuses it as "revision of auth store is old".
    jwt = f"jwt,pub-key={pki.jwt_public},priv-key={pki.jwt_key},sign-method=RS256,ttl=10m"
    etcd = launch(extra_args=[f"--auth-token={jwt}"])
    admin = Admin(etcd)
    admin.enable_auth()
    with EtcdStore(etcd.endpoints, _prefix(), timeout=30, user=USER, password=PASSWORD) as store:
        store.set("k", "v")
        admin.post("/v3/auth/role/add", {"name": "unrelated"})
        assert store.get("k") == b"v"
        admin.add_user("another", "password", "unrelated")
        _exercise(store)


# -- the backend end to end ----------------------------------------------------------------
def test_a_rendezvous_over_tls_with_client_certificates_and_a_password(
    launch: Callable[..., LocalEtcd], pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    etcd = launch(tls=EtcdTls(pki.server_cert, pki.server_key, client_ca=pki.ca))
    Admin(etcd, pki).enable_auth()
    monkeypatch.setenv(USER_ENV, USER)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    # host:port, so that the scheme comes from the protocol option.
    endpoint = f"localhost:{etcd.members[0].client_port}"
    nodes = 3
    handlers: list[Any] = []
    infos: list[RendezvousInfo] = []
    errors: list[BaseException] = []

    def node() -> None:
        params = RendezvousParameters(
            "etcd",
            endpoint,
            "secure-run",
            nodes,
            nodes,
            local_addr="127.0.0.1",
            etcd_prefix=RUN_PREFIX.rstrip("/"),
            protocol="https",
            cacert=str(pki.ca),
            cert=str(pki.client_cert),
            key=str(pki.client_key),
            read_timeout=30,
            join_timeout=60,
        )
        try:
            handler = create_handler(params)
            handlers.append(handler)
            infos.append(handler.next_rendezvous())
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=node, name=f"node-{i}") for i in range(nodes)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join(90)
        assert not errors, errors
        assert sorted(info.rank for info in infos) == list(range(nodes))
        assert {info.world_size for info in infos} == {nodes}
    finally:
        # Only once every node is through: a shutdown closes the rendezvous for all.
        for handler in handlers:
            handler.shutdown()


# -- passwords over plain http ------------------------------------------------------------
def _plain_http_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and "over plain http" in record.getMessage()
    ]


def test_a_password_over_plain_http_is_warned_about_once_per_store(
    auth_etcd: tuple[LocalEtcd, Admin], caplog: pytest.LogCaptureFixture
) -> None:
    etcd, _ = auth_etcd
    caplog.set_level(logging.WARNING, logger="tp_rdzv_etcd")
    with EtcdStore(etcd.endpoints, _prefix(), timeout=30, user=USER, password=PASSWORD) as store:
        (warning,) = _plain_http_warnings(caplog)
        assert USER in warning
        assert etcd.endpoints.split(",")[0] in warning
        assert PASSWORD not in warning
        with store.clone() as twin:
            twin.set("k", "v")
        assert len(_plain_http_warnings(caplog)) == 1


def test_no_warning_without_a_password_or_over_https(
    auth_etcd: tuple[LocalEtcd, Admin],
    tls_etcd: LocalEtcd,
    pki: Pki,
    caplog: pytest.LogCaptureFixture,
) -> None:
    etcd, _ = auth_etcd
    caplog.set_level(logging.WARNING, logger="tp_rdzv_etcd")
    EtcdStore(etcd.endpoints, _prefix(), timeout=30).close()
    https = EtcdStore(
        tls_etcd.endpoints, _prefix(), timeout=30, cacert=str(pki.ca), user=USER, password=PASSWORD
    )
    https.close()
    assert _plain_http_warnings(caplog) == []


def test_a_rendezvous_with_a_password_over_http_warns_once_per_handler(
    auth_etcd: tuple[LocalEtcd, Admin],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    etcd, _ = auth_etcd
    monkeypatch.setenv(USER_ENV, USER)
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    caplog.set_level(logging.WARNING, logger="tp_rdzv_etcd")
    handlers = [
        create_handler(
            RendezvousParameters(
                "etcd",
                etcd.endpoints,
                f"plain-{uuid.uuid4().hex[:8]}-{index}",
                1,
                1,
                local_addr="127.0.0.1",
                etcd_prefix=RUN_PREFIX.rstrip("/"),
                read_timeout=30,
            )
        )
        for index in range(2)
    ]
    try:
        for handler in handlers:
            # The steward's and the watcher's handles are clones: no more warnings.
            assert handler.next_rendezvous().world_size == 1
            handler.wait_for_change(0.1)
    finally:
        for handler in handlers:
            handler.shutdown()
    assert len(_plain_http_warnings(caplog)) == 2


def test_a_store_session_with_a_password_outlives_its_token(
    auth_etcd: tuple[LocalEtcd, Admin],
) -> None:
    etcd, admin = auth_etcd
    (member,) = etcd.members
    user = f"session-{uuid.uuid4().hex[:8]}"
    admin.add_user(user, PASSWORD, USER)
    with EtcdStore(etcd.endpoints, _prefix(), timeout=30, user=user, password=PASSWORD) as store:
        session = store.open_session(60)
        session.set("present/a", "token")
        session.add_will("departures", "a left")
        session.keep_alive()
        _deleted_token(member, user)  # the session's token expired unused
        session.keep_alive()
        session.set("present/a", "again")
        session.close()
        assert not store.check(["present/a"])
        assert store.queue_pop("departures", block=False) == b"a left"
