"""tensorplay.distributed: the key/value stores, re-exported from ``tp_store``."""

from tp_store import FileStore, HashStore, PrefixStore, Store, TCPStore

__all__ = ["FileStore", "HashStore", "PrefixStore", "Store", "TCPStore"]
