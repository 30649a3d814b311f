"""The ``Store`` implementations, one module each.

- :mod:`~tp_store.stores.tcp_store`: :class:`~tp_store.TCPStore`, PyTorch's
  TCPStore client (and, for the master, its server);
- :mod:`~tp_store.stores.hash_store`: :class:`~tp_store.HashStore`, in-process;
- :mod:`~tp_store.stores.file_store`: :class:`~tp_store.FileStore`, a file
  shared by processes;
- :mod:`~tp_store.stores.prefix_store`: :class:`~tp_store.PrefixStore`, a
  namespace inside another store.

Import them from ``tp_store``.
"""
