"""What the multi-process tests run in each child process.

Children started with the "spawn" method cannot import the test modules (pytest
imports them by path), so the per-rank code lives in this plain module.
"""

from __future__ import annotations

import traceback
from multiprocessing.queues import Queue
from typing import Any

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_static import create_rdzv_handler
from tp_store import PrefixStore


def run_rank(port: int, rank: int, world_size: int, run_id: str, results: Queue[Any]) -> None:
    """Join the static rendezvous as ``rank``, exchange keys, report what was seen.

    Every rank writes ``hello/<rank>`` and reads every other rank's key through
    ``RendezvousInfo.store``; rank 0 (which hosts the store) waits for every
    other rank to be done before returning, so the store outlives their use.
    """
    try:
        params = RendezvousParameters(
            backend="static",
            endpoint=f"127.0.0.1:{port}",
            run_id=run_id,
            min_nodes=world_size,
            max_nodes=world_size,
            node_rank=rank,
            config={"read_timeout": 60},
        )
        handler = create_rdzv_handler(params)
        first = handler.next_rendezvous()
        second = handler.next_rendezvous()
        store = first.store
        store.set(f"hello/{rank}", f"from rank {rank}")
        seen = {str(peer): store.get(f"hello/{peer}").decode() for peer in range(world_size)}
        counter = store.add("joined", 1)
        # The keys live under run_id in the one store that rank 0 hosts.
        if not isinstance(store, PrefixStore):
            raise TypeError(f"RendezvousInfo.store should be a PrefixStore, got {store!r}")
        raw = store.underlying_store.get(f"{run_id}/hello/{rank}").decode()
        if rank == 0:
            store.wait([f"done/{peer}" for peer in range(1, world_size)])
            total = int(store.get("joined"))
        else:
            total = -1
        report = {
            "rank": first.rank,
            "world_size": first.world_size,
            "bootstrap": _store_info(first),
            "second": [second.rank, second.world_size, _store_info(second)],
            "seen": seen,
            "counter": counter,
            "total": total,
            "raw": raw,
            "backend": handler.get_backend(),
            "run_id": handler.get_run_id(),
            "use_agent_store": handler.use_agent_store,
            "closed": handler.is_closed(),
            "waiting": handler.num_nodes_waiting(),
        }
        if rank != 0:
            store.set(f"done/{rank}", "1")
        results.put(report)
    except BaseException:
        results.put({"rank": rank, "error": traceback.format_exc()})
        raise


def _store_info(info: Any) -> list[Any]:
    bootstrap = info.bootstrap_store_info
    return [bootstrap.master_addr, bootstrap.port]
