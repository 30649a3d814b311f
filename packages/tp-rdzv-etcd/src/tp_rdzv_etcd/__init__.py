"""tp-rdzv-etcd: the dynamic rendezvous on etcd's v3 API (backend ``etcd``)."""

from .__about__ import __version__
from .endpoints import Endpoint, parse_endpoints
from .session import EtcdSession
from .store import EtcdStore

__all__ = ["Endpoint", "EtcdSession", "EtcdStore", "__version__", "parse_endpoints"]
