"""torchrun, noting its rendezvous's departure records for ``restart_bench.py``.

``python logged_torchrun.py TORCHRUN-ARGS...`` runs ``torch.distributed.run``
in this process after :func:`departures.watch_departures`: every record goes as
one JSON line to ``$TP_BENCH_DEPARTURES/<pid>.jsonl``. Our events also go to
stderr with their time (without a handler of ours they would print without one).
"""

from __future__ import annotations

import json
import logging
import os
import runpy
from pathlib import Path

from departures import OURS_LOGGER, Departure, watch_departures

#: The directory of the departure files, one per agent.
DEPARTURES_ENV = "TP_BENCH_DEPARTURES"


def main() -> None:
    path = Path(os.environ[DEPARTURES_ENV]) / f"{os.getpid()}.jsonl"

    def note(departure: Departure) -> None:
        with path.open("a") as out:
            out.write(json.dumps(departure.to_json()) + "\n")

    watch_departures(note, with_torch=True)
    shown = logging.StreamHandler()
    shown.setLevel(logging.WARNING)
    shown.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    logging.getLogger(OURS_LOGGER).addHandler(shown)
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
