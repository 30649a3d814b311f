"""Structured log events: one line for people, fields for machines.

Every event carries ``action`` and ``run_id`` as attributes of the log record
(``extra``), plus ``node``, ``round`` and ``duration`` (seconds) when they
apply, so a JSON formatter can emit them as fields without parsing text.

``round_complete`` also carries the membership the steward committed:
``world_size`` and ``participants_digest`` (see :func:`participants_digest`).
A log of these records is a log of committed rounds: two records of one run
and round with different digests would mean two memberships for one round.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

#: The record attributes an event may carry, besides the message.
EVENT_FIELDS = (
    "action",
    "run_id",
    "node",
    "round",
    "duration",
    "world_size",
    "participants_digest",
)


def participants_digest(participants: Sequence[object]) -> str:
    """A short fingerprint of ``participants`` in rank order (``str()`` of each node).

    Anyone holding the list (a node's ``RendezvousInfo.participants``, the
    published outcome) computes the same value, so logs can be checked against
    what nodes saw without logging thousands of names per round.
    """
    text = "\n".join(str(node) for node in participants)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    participants: Sequence[object] | None = None,
) -> None:
    """Log ``message`` at ``level`` as the event ``action`` of the run ``run_id``.

    ``participants`` (in rank order) adds ``world_size`` and ``participants_digest``.
    """
    if not logger.isEnabledFor(level):
        return
    fields: dict[str, object] = {"action": action, "run_id": run_id}
    if node is not None:
        fields["node"] = str(node)
    if round_ is not None:
        fields["round"] = round_
    if duration is not None:
        fields["duration"] = round(duration, 6)
    if participants is not None:
        fields["world_size"] = len(participants)
        fields["participants_digest"] = participants_digest(participants)
    logger.log(level, "rendezvous %r: %s", run_id, message, extra=fields)
