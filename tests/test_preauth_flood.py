"""Under unauthenticated floods and stalled pre-auth clients, a client with the secret
connects and is served (``benchmarks/preauth_flood.py``, briefly; it prints its figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "preauth_flood.py"


def test_a_client_with_the_secret_is_served_under_attack(
    capsys: pytest.CaptureFixture[str],
) -> None:
    arguments = ["--floods", "4", "--stalled", "31", "--gets", "300", "--json"]
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(result.stdout)
    with capsys.disabled():
        attacked = figures["attacked"]
        print(
            f"\nunder attack: connected in {attacked['connect_s'] * 1e3:.1f} ms, "
            f"median GET {attacked['median_s'] * 1e3:.3f} ms "
            f"(alone {figures['alone']['median_s'] * 1e3:.3f} ms)"
        )
    assert figures["max_connections"] == 4 + 31 + 1
    assert figures["attacked"]["gets"] == 300
