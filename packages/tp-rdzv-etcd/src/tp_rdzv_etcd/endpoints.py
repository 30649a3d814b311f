"""The members of an etcd cluster, as a rendezvous endpoint names them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tp_rdzv_api.utils import parse_rendezvous_endpoint

#: etcd's client port.
DEFAULT_PORT = 2379
PROTOCOLS = ("http", "https")


@dataclass(frozen=True)
class Endpoint:
    """One etcd member's client URL."""

    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        """``scheme://host:port`` (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def __str__(self) -> str:
        return self.url


def parse_endpoints(endpoints: str | Sequence[str], protocol: str = "http") -> tuple[Endpoint, ...]:
    """The members named by ``endpoints``: comma-separated URLs or ``host[:port]``s.

    ``protocol`` (``http`` or ``https``) applies to entries without a scheme;
    the port defaults to 2379. Raises ``ValueError`` quoting a malformed entry,
    an unknown scheme or an empty list.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"the etcd protocol must be http or https, got {protocol!r}")
    if isinstance(endpoints, str):
        entries = endpoints.split(",")
    elif isinstance(endpoints, Sequence):
        entries = list(endpoints)
    else:
        raise TypeError(f"etcd endpoints must be a str or a list of str, got {endpoints!r}")
    found: list[Endpoint] = []
    for entry in entries:
        if not isinstance(entry, str):
            raise TypeError(f"an etcd endpoint must be a str, got {entry!r}")
        text = entry.strip()
        if not text:
            continue
        scheme, separator, rest = text.partition("://")
        if not separator:
            scheme, rest = protocol, text
        scheme = scheme.lower()
        if scheme not in PROTOCOLS:
            raise ValueError(f"etcd endpoint {entry!r}: the scheme must be http or https")
        rest = rest.rstrip("/")
        if "/" in rest:
            raise ValueError(f"etcd endpoint {entry!r}: a client URL has no path")
        host, port = parse_rendezvous_endpoint(rest, default_port=DEFAULT_PORT)
        found.append(Endpoint(scheme, host, port))
    if not found:
        raise ValueError(f"no etcd endpoint in {endpoints!r}")
    return tuple(dict.fromkeys(found))
