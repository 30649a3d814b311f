"""One node: PyTorch's ``LocalElasticAgent`` on a handler from our ``create_handler``.

``python local_agent.py ENDPOINT RUN_ID MARKER_DIR``: backend ``core`` at
``ENDPOINT`` (the store runs elsewhere), 2 workers of ``elastic_train.py
MARKER_DIR 5 fail-first``, up to 3 restarts. Exits 0 when the agent's run
succeeded, 1 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch.distributed.elastic.agent.server import WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

from tp_rdzv_api import RendezvousParameters, create_handler

TRAIN_SCRIPT = Path(__file__).resolve().parent / "elastic_train.py"


def main() -> int:
    endpoint, run_id, markers = sys.argv[1:4]
    handler = create_handler(
        RendezvousParameters(
            "core",
            endpoint,
            run_id,
            min_nodes=1,
            max_nodes=1,
            local_addr="127.0.0.1",
            config={"is_host": "false", "last_call_timeout": 0.1, "keep_alive_interval": 1},
        )
    )
    spec = WorkerSpec(
        role="trainer",
        local_world_size=2,
        entrypoint=sys.executable,
        args=("-u", str(TRAIN_SCRIPT), markers, "5", "fail-first"),
        rdzv_handler=handler,
        max_restarts=3,
        monitor_interval=0.1,
    )
    try:
        result = LocalElasticAgent(spec, DefaultLogsSpecs(log_dir=markers + "-logs")).run()
    finally:
        handler.shutdown()
    print(f"agent finished: {result.state.name}", flush=True)
    return 0 if result.state == WorkerState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
