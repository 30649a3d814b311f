"""tp_rdzv_etcd.local: throwaway etcd members on loopback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.local import (
    BINARY_ENV,
    EtcdNotFoundError,
    EtcdTls,
    LocalEtcd,
    find_etcd,
    free_ports,
)


def test_endpoints_are_the_members_client_urls() -> None:
    etcd = LocalEtcd(3)  # not started: the ports are chosen already
    urls = etcd.endpoints.split(",")
    assert urls == [member.client_url for member in etcd.members]
    assert all(re.fullmatch(r"http://127\.0\.0\.1:\d+", url) for url in urls), urls
    assert [member.name for member in etcd.members] == ["m0", "m1", "m2"]
    assert not any(member.alive() for member in etcd.members)
    assert all(member.pid is None for member in etcd.members)
    assert len(set(urls)) == 3


def test_tls_members_serve_https() -> None:
    etcd = LocalEtcd(2, tls=EtcdTls("s.pem", "s.key"))
    assert all(re.fullmatch(r"https://127\.0\.0\.1:\d+", url) for url in etcd.endpoints.split(","))


def test_tls_flags() -> None:
    assert EtcdTls("s.pem", "s.key").flags() == ["--cert-file=s.pem", "--key-file=s.key"]
    assert EtcdTls("s.pem", "s.key", client_ca="ca.pem").flags() == [
        "--cert-file=s.pem",
        "--key-file=s.key",
        "--client-cert-auth",
        "--trusted-ca-file=ca.pem",
    ]


def test_free_ports_are_distinct() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6
    assert all(0 < port < 65536 for port in ports)


def test_a_missing_binary_says_how_to_install(tmp_path: Path) -> None:
    bogus = str(tmp_path / "no-such-etcd")
    assert find_etcd(bogus) is None
    etcd = LocalEtcd(binary=bogus)
    with pytest.raises(EtcdNotFoundError, match="apt-get install etcd-server"):
        etcd.start()
    assert not etcd.members[0].alive()


def test_a_named_binary_does_not_fall_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    not_executable = tmp_path / "etcd"
    not_executable.write_text("")
    monkeypatch.setenv(BINARY_ENV, str(not_executable))
    assert find_etcd() is None
    with pytest.raises(EtcdNotFoundError, match=BINARY_ENV):
        LocalEtcd().start()


@pytest.mark.etcd
def test_start_serves_and_stop_cleans_up(etcd_binary: str) -> None:
    with LocalEtcd(binary=etcd_binary) as etcd:
        (member,) = etcd.members
        assert member.alive()
        # The pid is the etcd process's (benchmarks read its CPU time there).
        assert member.pid is not None
        assert "etcd" in Path(f"/proc/{member.pid}/comm").read_text()
        assert member.data_dir is not None
        assert member.data_dir.is_dir()
        assert etcd.leader() is member
        with EtcdStore(etcd.endpoints, "/local/", timeout=10) as store:
            store.set("k", "v")
            assert store.get("k") == b"v"
    assert not member.alive()
    assert not member.data_dir.parent.exists(), "the temporary data dir was left behind"
    etcd.stop()  # again: nothing left to do


@pytest.mark.etcd
def test_a_given_data_root_is_the_callers(etcd_binary: str, tmp_path: Path) -> None:
    with LocalEtcd(binary=etcd_binary, data_root=tmp_path) as etcd:
        assert etcd.members[0].data_dir == tmp_path / "m0"
    assert (tmp_path / "m0").is_dir()


def test_a_member_that_exits_fails_with_its_log(tmp_path: Path) -> None:
    binary = tmp_path / "etcd"
    binary.write_text("#!/bin/sh\necho 'cannot listen: address already in use' >&2\nexit 1\n")
    binary.chmod(0o755)
    etcd = LocalEtcd(binary=str(binary))
    with pytest.raises(RuntimeError, match="did not start") as failed:
        etcd.start(timeout=30)
    assert "address already in use" in str(failed.value)
    assert not isinstance(failed.value, EtcdNotFoundError)
    assert not etcd.members[0].alive()
    data_dir = etcd.members[0].data_dir
    assert data_dir is not None
    assert not data_dir.parent.exists(), "the temporary data dir was left behind"
