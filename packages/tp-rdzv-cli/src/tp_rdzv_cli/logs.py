"""Log output of the commands: readable text, or one JSON object per line.

The rendezvous and the store attach fields to their records (``action``,
``run_id``, ``node``, ``round``, ``duration``, ``peer``, ...); the JSON format
emits every such field, so logs can be filtered without parsing messages.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

#: Attributes every LogRecord has; anything else came in through ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_"):
                document[name] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


def configure(level: str, style: str) -> None:
    """Send log records of ``level`` and above to stderr, as ``style`` (text or json)."""
    handler = logging.StreamHandler(sys.stderr)
    if style == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
