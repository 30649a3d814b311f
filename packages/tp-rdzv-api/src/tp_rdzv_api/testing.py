"""Test helpers for a backend's config keys: which keys it reads, what it warns about.

A backend declares the config keys it understands and warns about the rest
(:func:`tp_rdzv_api.config_keys.warn_unknown_config_keys`). These helpers let
its tests check both: that the declared set is exactly what the backend reads,
and which warnings a handler's creation logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from .config_keys import log as _warner


class RecordingConfig(dict[str, Any]):
    """A ``RendezvousParameters.config`` that records every key read from it (in :attr:`read`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def config_key_warnings(records: Iterable[logging.LogRecord]) -> list[str]:
    """The messages of the unknown-config-key warnings among ``records`` (e.g. pytest's
    ``caplog.records``)."""
    return [record.getMessage() for record in records if record.name == _warner.name]
