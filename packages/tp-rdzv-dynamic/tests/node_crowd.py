"""Many dynamic-rendezvous nodes as threads of one process: a crowd for the large-round test.

Run as a script: ``node_crowd.py HOST PORT RUN_ID COUNT WORLD``. It makes
COUNT handlers (each on its own store connection) of run RUN_ID with
``min_nodes = max_nodes = WORLD``, prints ``ready``, and on a ``go`` line on
stdin has them all call ``next_rendezvous()`` at once; then prints one JSON
line: every node's rank and world size, and the participant list one of them
read (``str`` of each node), then exits.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from tp_rdzv_api import RendezvousTimeout
from tp_rdzv_dynamic import DynamicRendezvousHandler, TpRendezvousBackend
from tp_store import TCPStore


def main(host: str, port: int, run_id: str, count: int, world: int) -> None:
    threading.stack_size(256 * 1024)
    handlers = []
    for _ in range(count):
        store = TCPStore(host, port, timeout=timedelta(seconds=120))
        handlers.append(
            DynamicRendezvousHandler.from_backend(
                run_id,
                store,
                TpRendezvousBackend(store, run_id),
                world,
                world,
                local_addr="127.0.0.1",
                timeout=RendezvousTimeout(join=timedelta(seconds=120)),
                keep_alive_interval=5,
                keep_alive_max_attempt=6,
            )
        )
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    with ThreadPoolExecutor(count) as pool:
        infos = list(pool.map(lambda handler: handler.next_rendezvous(), handlers))
    print(
        json.dumps(
            {
                "ranks": [info.rank for info in infos],
                "world_sizes": [info.world_size for info in infos],
                "participants": [str(node) for node in infos[0].participants],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
