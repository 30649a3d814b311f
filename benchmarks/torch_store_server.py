#!/usr/bin/env python3
"""torch's TCPStore server alone in a process: a libuv master until SIGTERM or SIGINT.

Prints ``listening on 127.0.0.1:PORT`` once it listens, as ``python -m tp_store`` does.
"""

from __future__ import annotations

import signal
import threading
from datetime import timedelta

import torch.distributed as dist


def main() -> None:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    master = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        use_libuv=True,
        timeout=timedelta(seconds=3600),
    )
    print(f"listening on 127.0.0.1:{master.port}", flush=True)
    stop.wait()


if __name__ == "__main__":
    main()
