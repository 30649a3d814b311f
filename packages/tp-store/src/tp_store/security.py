"""TLS contexts and shared secrets for the TCPStore, from files and the environment.

Both are off by default: a store without them speaks plain PyTorch TCPStore,
open to anyone who reaches its port. Everything here is the standard
library's ``ssl`` and ``os``.

Secrets are read from a file or an environment variable, never from a
command-line argument (which every user of the machine can read in the
process list):

- ``TP_STORE_SECRET``: the secret itself;
- ``TP_STORE_SECRET_FILE``: the path of a file holding it.

A secret file's content is used as bytes, without its trailing newline.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from .protocol import check_secret

_log = logging.getLogger(__name__)

#: Environment variable holding the store secret itself.
SECRET_ENV: str = "TP_STORE_SECRET"
#: Environment variable holding the path of a file with the store secret.
SECRET_FILE_ENV: str = "TP_STORE_SECRET_FILE"

#: The largest secret file read: a secret is a few dozen bytes.
MAX_SECRET_FILE_BYTES: int = 4096

#: A file path, as the TLS and secret options take it.
PathLike = str | os.PathLike[str]


def read_secret_file(path: PathLike) -> bytes:
    """The secret in the file at ``path`` (trailing line breaks dropped).

    Raises ``ValueError`` naming the file when it cannot be read, is empty, is
    not a regular file (``/dev/zero`` would never end) or is larger than
    :data:`MAX_SECRET_FILE_BYTES`. Logs a warning when other users may read it.
    """
    name = os.fspath(path)
    try:
        # Non-blocking, so that opening a FIFO without a writer returns at once.
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ValueError(f"cannot read the store secret file {name!r}: {exc.strerror}") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ValueError(f"the store secret file {name!r} is not a regular file")
    with open(fd, "rb") as file:
        try:
            content = file.read(MAX_SECRET_FILE_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"cannot read the store secret file {name!r}: {exc}") from exc
    if len(content) > MAX_SECRET_FILE_BYTES:
        raise ValueError(
            f"the store secret file {name!r} is over {MAX_SECRET_FILE_BYTES} bytes: "
            "is it the right file?"
        )
    secret = content.rstrip(b"\r\n")
    if not secret:
        raise ValueError(f"the store secret file {name!r} is empty")
    if os.name == "posix" and mode & (stat.S_IRGRP | stat.S_IROTH):
        readers = "every user" if mode & stat.S_IROTH else "its group"
        _log.warning(
            "the store secret file %r can be read by %s (mode %s): make it readable by its "
            "owner only (chmod 600)",
            name,
            readers,
            oct(stat.S_IMODE(mode)),
        )
    return secret


def load_secret(
    secret: bytes | None = None,
    secret_file: PathLike | None = None,
    environ: Mapping[str, str] | None = None,
) -> bytes | None:
    """The store secret to use, or None for none.

    In order: ``secret``, the file ``secret_file``, then the environment
    (:data:`SECRET_ENV`, then :data:`SECRET_FILE_ENV`). Giving both
    ``secret`` and ``secret_file``, or setting both variables, is ambiguous
    and raises ``ValueError``, as does an empty secret.
    """
    if secret is not None and secret_file is not None:
        raise ValueError("give either a store secret or a secret file, not both")
    if secret is not None:
        return check_secret(secret)
    if secret_file is not None:
        return check_secret(read_secret_file(secret_file))
    env = os.environ if environ is None else environ
    value = env.get(SECRET_ENV)
    path = env.get(SECRET_FILE_ENV)
    if value is not None and path is not None:
        raise ValueError(f"set either {SECRET_ENV} or {SECRET_FILE_ENV}, not both")
    if value is not None:
        if not value:
            raise ValueError(f"{SECRET_ENV} is set but empty")
        return check_secret(value.encode())
    if path is not None:
        if not path:
            raise ValueError(f"{SECRET_FILE_ENV} is set but empty")
        return check_secret(read_secret_file(path))
    return None


def _load_chain(context: ssl.SSLContext, cert: PathLike, key: PathLike | None, what: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        key_text = "" if key is None else f" and key {os.fspath(key)!r}"
        raise ValueError(
            f"cannot load the {what} certificate {os.fspath(cert)!r}{key_text}: {exc}"
        ) from exc


def _load_ca(context: ssl.SSLContext, ca: PathLike, what: str) -> None:
    try:
        context.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the {what} CA file {os.fspath(ca)!r}: {exc}") from exc


def server_ssl_context(
    cert: PathLike, key: PathLike | None = None, client_ca: PathLike | None = None
) -> ssl.SSLContext:
    """A server's TLS context: its certificate chain and key (PEM files), TLS 1.2 or newer.

    With ``client_ca``, every client must present a certificate signed by it
    (mutual TLS). ``key`` may be omitted when ``cert`` holds the key too.
    Raises ``ValueError`` naming the file that cannot be loaded.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert, key, "server")
    if client_ca is not None:
        _load_ca(context, client_ca, "client")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(
    ca: PathLike, cert: PathLike | None = None, key: PathLike | None = None
) -> ssl.SSLContext:
    """A client's TLS context: the server must present a certificate signed by ``ca``
    and valid for the host name (or address) dialled.

    ``cert`` (and ``key``) is this client's certificate, for servers that
    require one. Raises ``ValueError`` naming the file that cannot be loaded.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # Trust anchors need not be roots (as Python 3.13's defaults): an
    # intermediate CA, or a server's own certificate pinned as the CA.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    _load_ca(context, ca, "server")
    if cert is not None:
        _load_chain(context, cert, key, "client")
    elif key is not None:
        raise ValueError("a TLS key was given without its certificate")
    return context


@dataclass(frozen=True)
class TLSConfig:
    """Where a store's TLS files are (PEM), for both of its roles.

    - ``cert``/``key``: a server's certificate and key; for a client, the
      certificate it presents to servers that require one.
    - ``ca``: the CA that signs the servers' certificates (a client verifies
      the server against it, host name included).
    - ``client_ca``: on a server, require client certificates signed by it.

    A client uses TLS when ``ca`` is set; a server when ``cert`` is.
    """

    cert: PathLike | None = None
    key: PathLike | None = None
    ca: PathLike | None = None
    client_ca: PathLike | None = None

    def __post_init__(self) -> None:
        if self.key is not None and self.cert is None:
            raise ValueError("tls_key was given without tls_cert")
        if self.client_ca is not None and self.cert is None:
            raise ValueError("tls_client_ca needs tls_cert (a server certificate)")

    @property
    def enabled(self) -> bool:
        """Whether any TLS file is set."""
        return any(path is not None for path in (self.cert, self.ca, self.client_ca))

    def server_context(self) -> ssl.SSLContext:
        """The context of a server (``ValueError`` without ``cert``)."""
        if self.cert is None:
            raise ValueError("a TLS server needs tls_cert (and tls_key)")
        return server_ssl_context(self.cert, self.key, self.client_ca)

    def client_context(self) -> ssl.SSLContext:
        """The context of a client (``ValueError`` without ``ca``)."""
        if self.ca is None:
            raise ValueError(
                "a TLS client needs tls_ca, the CA that signed the server's certificate"
            )
        return client_ssl_context(self.ca, self.cert, self.key)

    def own_server_context(self) -> ssl.SSLContext:
        """The context with which a master reaches the server it hosts itself.

        With ``ca``, a client context as any other. Without, it trusts exactly
        its own server's certificate (pinned, so the host name is not checked:
        the master dials its own listening socket, maybe by another name).
        """
        if self.ca is not None:
            return self.client_context()
        assert self.cert is not None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False
        # A leaf certificate as the trust anchor: accepted without its chain.
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        _load_ca(context, self.cert, "own server")
        _load_chain(context, self.cert, self.key, "client")
        return context
