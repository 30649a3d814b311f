"""Make the fuzz harnesses (plain scripts in this folder) importable by the tests."""

from __future__ import annotations

import sys
from pathlib import Path

# Tests are imported with --import-mode=importlib, which leaves sys.path alone.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
