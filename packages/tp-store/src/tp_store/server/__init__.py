"""The TCPStore server: an asyncio server and what only the server side uses.

- :mod:`~tp_store.server.store_server`: :class:`~tp_store.StoreServer` (the
  asyncio server, its connections and counters) and ``ServerThread`` (one
  running in a background thread);
- :mod:`~tp_store.server.state`: the data the server holds and its waiters,
  without I/O (the protocol's ``ServerSession`` applies requests to it);
- :mod:`~tp_store.server.session_table`: the server's store sessions, their
  silence timers and counters;
- :mod:`~tp_store.server.shared_servers`: the in-process servers of
  ``TCPStore`` masters, shared by port;
- :mod:`~tp_store.server.log_throttle`: at most so many log lines per interval.

This package re-exports nothing: its modules sit on both sides of the
protocol (the protocol's ``ServerSession`` imports ``state``, ``store_server``
imports the protocol). Import from ``tp_store`` or from the module.
"""
