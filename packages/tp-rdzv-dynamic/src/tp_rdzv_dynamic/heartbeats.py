"""A node's heartbeats while its round runs (while it waits, its join loop beats)."""

from __future__ import annotations

import logging
import threading

from tp_rdzv_api import RendezvousError

from .board import RendezvousBoard
from .events import log_event
from .node import _NodeDesc

log = logging.getLogger(__name__)


class Heartbeats:
    """Increments ``node``'s counter every ``interval`` seconds, in a thread, until stopped."""

    def __init__(self, board: RendezvousBoard, node: _NodeDesc, interval: float) -> None:
        self._board = board
        self._node = node
        self._interval = interval
        self._stop: threading.Event | None = None

    def start(self, round_: int) -> None:
        """Beat for the nodes of ``round_`` (it names the round in its log records)."""
        stop = threading.Event()
        self._stop = stop
        thread = threading.Thread(
            target=self._beat_until,
            args=(stop, round_),
            name=f"tp-rdzv-heartbeat-{self._node}",
            daemon=True,
        )
        thread.start()

    def stop(self) -> None:
        """Stop beating (the thread ends at its next tick)."""
        if self._stop is not None:
            self._stop.set()
            self._stop = None

    def _beat_until(self, stop: threading.Event, round_: int) -> None:
        while not stop.wait(self._interval):
            try:
                self._board.beat(self._node)
            except RendezvousError as exc:
                log_event(
                    log,
                    logging.WARNING,
                    "heartbeat_failed",
                    f"heartbeat failed: {exc}",
                    run_id=self._board.run_id,
                    node=self._node,
                    round_=round_,
                )
