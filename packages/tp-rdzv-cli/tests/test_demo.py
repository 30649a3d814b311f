"""``tp-rdzv demo``, as the README runs it: its summary is checked, not just its exit code."""

from __future__ import annotations

import json

from cli_support import run_tp_rdzv


def test_demo_three_nodes_kill_one_json_summary():
    result = run_tp_rdzv("demo", "--nodes", "3", "--kill", "1", "--json", timeout=180)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["ok"] is True
    assert summary["nodes"] == 3
    assert len(summary["killed"]) == 1
    assert summary["first_round"]["world_size"] == 3
    recovery = summary["recovery"]
    assert recovery["world_size"] == 2
    assert recovery["round"] > summary["first_round"]["round"]
    assert recovery["seconds_after_kill"] > 0
    survivors = {f"n{i}" for i in range(3)} - set(summary["killed"])
    assert summary["exit_codes"] == dict.fromkeys(sorted(survivors), 0)


def test_demo_text_summary():
    result = run_tp_rdzv("demo", "--nodes", "3", "--kill", "1", timeout=180)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "tp-rdzv demo: OK" in out
    assert "3 started, 1 killed with SIGKILL, 2 survived" in out
    assert "round 0: 3 nodes" in out or "3 nodes, ranks 0-2" in out
    assert "2 nodes, ranks 0-1" in out
    assert "2 of 2 agents exited 0" in out
