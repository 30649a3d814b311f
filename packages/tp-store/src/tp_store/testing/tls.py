"""Throwaway TLS certificates for tests, made with the ``openssl`` command.

A :class:`TestPKI` is a CA, a server certificate valid for the loopback
names (``localhost``, ``127.0.0.1``, ``::1``; usable as a client certificate too, as
a cluster node's would be), a client certificate signed by
the same CA, and a second CA that signed nothing of ours (to show that
verification fails). Keys are EC P-256: quick to generate. Nothing here is
for production: the keys are unencrypted files.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Names the server certificate is valid for.
LOOPBACK_SAN = "DNS:localhost,IP:127.0.0.1,IP:::1"


@dataclass(frozen=True)
class TestPKI:
    """Paths of the PEM files of a test PKI (see the module docstring)."""

    __test__ = False  # not a pytest test class, despite the name

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def _ca(directory: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
        "-subj", f"/CN=tp-store test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip


def _leaf(directory: Path, name: str, usage: str, san: str | None) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=tp-store test {name}",
        cwd=directory,
    )  # fmt: skip
    extensions = [f"extendedKeyUsage={usage}", "basicConstraints=CA:FALSE"]
    if san is not None:
        extensions.append(f"subjectAltName={san}")
    (directory / f"{name}.ext").write_text("\n".join(extensions) + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        cwd=directory,
    )  # fmt: skip


def make_test_pki(directory: Path) -> TestPKI:
    """Create the files of a :class:`TestPKI` in ``directory`` (which must exist).

    Raises ``RuntimeError`` when the ``openssl`` command is missing or fails.
    """
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is needed to make test certificates")
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    _leaf(directory, "server", "serverAuth,clientAuth", LOOPBACK_SAN)
    _leaf(directory, "client", "clientAuth", None)
    return TestPKI(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.pem",
    )
