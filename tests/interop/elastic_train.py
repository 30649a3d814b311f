"""A small DDP job on gloo, run by torchrun's workers in the elastic-restart tests.

``python elastic_train.py MARKER_DIR STEPS [fail-first]``. Each worker joins the process
group through the agent's bootstrap store (``env://``; torchrun sets
``MASTER_ADDR``, ``MASTER_PORT`` and ``TORCHELASTIC_USE_AGENT_STORE``), trains
``STEPS`` steps of a tiny DDP model and checks an ``all_reduce`` at every one.
It reports through JSON files in ``MARKER_DIR`` (written whole, then renamed):

- ``trained-a{attempt}-w{world}-r{rank}``: the steps of this attempt are done
  (``attempt`` is ``TORCHELASTIC_RESTART_COUNT``), with the worker's and its
  agent's pids, its group rank, when its process started and the time of
  its first step;
- ``done-a{attempt}-r{rank}``: the worker is exiting with 0.

Attempt 0 does not exit after training: every worker then waits to receive
from a worker of the other node (or, alone on one node, from its neighbour),
which never sends. Killing that node breaks the wait with an error, so the
worker fails and its agent restarts the job: that is the failure under test.
With ``fail-first``, attempt 0 exits 5 after training instead (a worker
failure without a dead node). A later attempt trains and exits 0.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before torch's imports, which take seconds on a loaded machine

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402


def write_marker(directory: Path, name: str, content: dict[str, object]) -> None:
    partial = directory / f".{name}.tmp"
    partial.write_text(json.dumps(content))
    partial.rename(directory / name)


def main() -> int:
    markers, steps = Path(sys.argv[1]), int(sys.argv[2])
    fail_first = sys.argv[3:] == ["fail-first"]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    first_step = 0.0
    for step in range(steps):
        loss = model(torch.full((4, 8), float(rank + step))).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
        expected = world * (world + 1) / 2
        if total.item() != expected:
            print(f"all_reduce gave {total.item()}, expected {expected}", file=sys.stderr)
            return 3
        if step == 0:
            first_step = time.time()
    report = {
        "pid": os.getpid(),
        "agent_pid": os.getppid(),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "started": STARTED,
        "first_step": first_step,
    }
    write_marker(markers, f"trained-a{attempt}-w{world}-r{rank}", report)
    if attempt == 0 and fail_first:
        return 5
    if attempt == 0:
        peer = (rank + max(world // 2, 1)) % world
        dist.recv(torch.zeros(1), src=peer)  # never sent: this ends when a node dies
        return 4
    dist.destroy_process_group()
    write_marker(markers, f"done-a{attempt}-r{rank}", report)
    return 0


def exit_now(code: int) -> None:
    """Exit without running C++ static destructors.

    torch 2.13's workers abort at interpreter exit now and then, after a clean
    ``destroy_process_group()`` ("terminate called without an active
    exception", exit code -6; 1 of 16 plain ``torchrun --standalone`` runs of a
    two-worker gloo job, with torch's own rendezvous and store). The agent
    counts that as a failed attempt and restarts: a restart none of our code
    caused. Our part ends with the markers, written above.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
