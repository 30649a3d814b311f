"""``tp-rdzv`` with every package installed: which backends it can drive."""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

TP_RDZV = Path(sysconfig.get_path("scripts")) / "tp-rdzv"


def test_join_refuses_the_static_backend_in_one_line():
    # Static rendezvous has no rounds to follow: the agent loop says so, it does not hang.
    result = subprocess.run(
        [
            str(TP_RDZV),
            "join",
            "--backend",
            "static",
            "--endpoint",
            "127.0.0.1:1",
            "--run-id",
            "r",
            "--min",
            "1",
            "--max",
            "1",
            "--config",
            "rank=0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "dynamic backend" in lines[0]
