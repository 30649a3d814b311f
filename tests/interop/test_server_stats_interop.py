"""Our client's extensions against PyTorch's servers: clear errors, no bytes sent.

A PyTorch server does not accept the protocol extensions, so our client never
sends it a STATS or SESSION_OPEN request (opcodes it would drop the
connection for): ``server_stats()`` and ``open_session()`` refuse at once.
"""

from __future__ import annotations

import pytest
from interop_support import TorchStore, WorkerPool

from tp_store import PrefixStore, TCPStore, UnsupportedOperationError

pytestmark = pytest.mark.interop

#: Store timeout of connections to a torch server (see test_our_client_torch_server.py).
CONNECT_TIMEOUT = 20.0


@pytest.mark.parametrize("use_libuv", [True, False], ids=["libuv", "legacy"])
def test_the_extensions_of_a_torch_server_are_clear_errors(
    workers: WorkerPool, use_libuv: bool
) -> None:
    (worker,) = workers.get(1)
    master: TorchStore = worker.store(
        host_name="127.0.0.1",
        port=0,
        is_master=True,
        use_libuv=use_libuv,
        timeout=CONNECT_TIMEOUT,
    )
    store = TCPStore("127.0.0.1", master.port, timeout=CONNECT_TIMEOUT)
    try:
        assert not store.uses_extensions
        message = (
            f"the server at 127.0.0.1:{master.port} does not support statistics "
            r"\(not a tp-store server\)"
        )
        with pytest.raises(UnsupportedOperationError, match=message):
            store.server_stats()
        with pytest.raises(UnsupportedOperationError, match=message):
            PrefixStore("job", store).server_stats()
        message = (
            f"the server at 127.0.0.1:{master.port} does not offer store sessions "
            r"\(not a tp-store server\)"
        )
        with pytest.raises(UnsupportedOperationError, match=message):
            store.open_session(5)
        with pytest.raises(UnsupportedOperationError, match=message):
            PrefixStore("job", store).open_session(5)
        # Nothing was sent: the connection still works, for torch's client too.
        store.set("after", "1")
        assert store.get("after") == b"1"
        assert master.get("after") == b"1"
    finally:
        store.close()
