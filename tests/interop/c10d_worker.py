"""A torchrun worker for the c10d tests: says it started, then waits to be released.

``c10d_worker.py HOST PORT KEY``: prints ``worker-started rank=R restart=N``,
blocks until KEY exists in the store at HOST:PORT (the test sets it), prints
``worker-released rank=R`` and exits 0.
"""

from __future__ import annotations

import os
import sys

from tp_store import TCPStore


def main() -> None:
    host, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rank = os.environ["RANK"]
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    print(f"worker-started rank={rank} restart={restart}", flush=True)
    with TCPStore(host, port, timeout=600) as store:
        store.wait([key])
    print(f"worker-released rank={rank}", flush=True)


if __name__ == "__main__":
    main()
