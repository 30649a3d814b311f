"""Store sessions: the API, its rules as data, and each store's implementation.

- :mod:`~tp_store.sessions.base`: :class:`~tp_store.StoreSession`, the
  interface ``Store.open_session`` returns, and the timeout's bounds;
- :mod:`~tp_store.sessions.presence`: who owns which key and what a session's
  end deletes and pushes, without I/O, shared by ``HashStore`` and the server;
- :mod:`~tp_store.sessions.hash_session`: the sessions of a ``HashStore``;
- :mod:`~tp_store.sessions.tcp_session`: the sessions of a ``TCPStore``.

This package re-exports nothing: its modules sit on both sides of the
protocol (the server's state imports ``presence``, ``tcp_session`` imports the
protocol). Import from ``tp_store`` or from the module.
"""
