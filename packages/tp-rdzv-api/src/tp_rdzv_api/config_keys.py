"""The config keys a backend understands: a warning for the others; the store's security keys.

``RendezvousParameters.config`` is open-ended, as in PyTorch: the launcher puts
every ``--rdzv-conf`` key in it, and keys of its own, whatever the backend.
Rejecting keys a backend does not read would break launches that work with
PyTorch; ignoring them in silence hides a misspelled ``tls_ca`` (a store left
open) or a key only another backend reads. So every backend, when it creates a
handler, calls :func:`warn_unknown_config_keys` with the keys it reads, and
one warning names the rest.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Collection, Mapping
from typing import Any, TypedDict, cast

from .parameters import RendezvousParameters

log = logging.getLogger(__name__)

#: Keys PyTorch's launcher passes to every backend, whether it reads them or
#: not: never warned about. ``timeout``: torchrun's ``LaunchConfig`` (PyTorch
#: 2.13, ``torch/distributed/launcher/api.py``) always sets
#: ``rdzv_configs["timeout"]`` (``--rdzv-timeout``, else 900), for every
#: backend; PyTorch's ``static`` and ``etcd`` read it, its ``c10d`` ignores it.
#: The only other key torchrun adds is ``rank``, and for ``static`` only
#: (``torch/distributed/run.py``), whose backend reads it.
LAUNCHER_KEYS = frozenset({"timeout"})

#: Config keys naming files that secure a ``tp_store.TCPStore``, spelled as its
#: keyword arguments; read by every backend that runs one (:func:`store_security`).
STORE_SECURITY_KEYS = ("tls_cert", "tls_key", "tls_ca", "tls_client_ca", "secret_file")

# How alike (difflib's ratio) an unknown key and a known one must be for the
# warning to suggest the known one: typos ("tls_cax", "read_timout", "is-host")
# pass, mere kinship ("secret" and "cert": 0.8) does not.
_TYPO_CUTOFF = 0.85


def unknown_config_keys(params: RendezvousParameters, known: Collection[str]) -> list[str]:
    """The keys of ``params.config`` outside ``known`` and :data:`LAUNCHER_KEYS`, sorted."""
    return sorted(
        (key for key in params.config if key not in known and key not in LAUNCHER_KEYS),
        key=str,
    )


def warn_unknown_config_keys(
    params: RendezvousParameters, backend: str, known: Collection[str]
) -> list[str]:
    """Log one warning naming the config keys that backend ``backend`` does not read.

    ``known`` is every key the backend reads. The warning names the others
    (sorted, each with the closest known key when one looks like a typo) and
    lists ``known``; nothing is logged when all keys are known. Keys in
    :data:`LAUNCHER_KEYS` are never named. Returns the keys named.
    """
    unknown = unknown_config_keys(params, known)
    if unknown:
        names = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=_TYPO_CUTOFF)
            names.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
        log.warning(
            "rendezvous config %s %s not understood by backend %r and ignored; "
            "backend %r understands: %s",
            "keys" if len(unknown) > 1 else "key",
            ", ".join(names),
            backend,
            backend,
            ", ".join(sorted(known)) or "(no config keys)",
            extra={"action": "unknown_config_keys", "backend": backend, "keys": unknown},
        )
    return unknown


class StoreSecurity(TypedDict, total=False):
    """The security keys a rendezvous config set, as ``tp_store.TCPStore`` keyword arguments."""

    tls_cert: str
    tls_key: str
    tls_ca: str
    tls_client_ca: str
    secret_file: str


def store_security(config: Mapping[str, Any]) -> StoreSecurity:
    """The :data:`STORE_SECURITY_KEYS` that ``config`` (a rendezvous config) sets.

    Raises ``ValueError`` naming a key whose value is not a non-empty path.
    """
    found: dict[str, str] = {}
    for key in STORE_SECURITY_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(
                f"rendezvous config option {key!r} must be the path of a file, got {value!r}"
            )
        found[key] = value.strip()
    return cast(StoreSecurity, found)


class TCPStoreSecurity(TypedDict):
    """The security keyword arguments of a ``tp_store.TCPStore`` (``None``: not set)."""

    tls_cert: str | None
    tls_key: str | None
    tls_ca: str | None
    tls_client_ca: str | None
    secret_file: str | None


def tcp_store_security(security: StoreSecurity, *, master: bool) -> TCPStoreSecurity:
    """``security`` as the arguments of a ``TCPStore`` that hosts the server (``master``)
    or only connects.

    ``tls_client_ca`` (which client certificates the server accepts) is the
    hosting node's option alone; a client would take it for a server CA.
    """
    return TCPStoreSecurity(
        tls_cert=security.get("tls_cert"),
        tls_key=security.get("tls_key"),
        tls_ca=security.get("tls_ca"),
        tls_client_ca=security.get("tls_client_ca") if master else None,
        secret_file=security.get("secret_file"),
    )
