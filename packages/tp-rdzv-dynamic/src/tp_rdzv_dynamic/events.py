"""Structured log events: one line for people, fields for machines.

Every event carries ``action`` and ``run_id`` as attributes of the log record
(``extra``), plus ``node``, ``round`` and ``duration`` (seconds) when they
apply, so a JSON formatter can emit them as fields without parsing text.
"""

from __future__ import annotations

import logging

#: The record attributes an event may carry, besides the message.
EVENT_FIELDS = ("action", "run_id", "node", "round", "duration")


def log_event(
    logger: logging.Logger,
    level: int,
    action: str,
    message: str,
    *,
    run_id: str,
    node: object = None,
    round_: int | None = None,
    duration: float | None = None,
) -> None:
    """Log ``message`` at ``level`` as the event ``action`` of the run ``run_id``."""
    if not logger.isEnabledFor(level):
        return
    fields: dict[str, object] = {"action": action, "run_id": run_id}
    if node is not None:
        fields["node"] = str(node)
    if round_ is not None:
        fields["round"] = round_
    if duration is not None:
        fields["duration"] = round(duration, 6)
    logger.log(level, "rendezvous %r: %s", run_id, message, extra=fields)
