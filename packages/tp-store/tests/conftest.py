"""Shared test setup: make ``store_workers`` importable here and in child processes."""

from __future__ import annotations

import sys
from pathlib import Path

# Tests are imported with --import-mode=importlib, which leaves sys.path alone;
# spawned children copy sys.path, so this also lets them import store_workers.
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
