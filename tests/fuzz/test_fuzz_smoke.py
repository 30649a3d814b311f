"""A short run of the network fuzzer against a live ``python -m tp_store`` server."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import fuzz_store_server as fuzz

SCRIPT = Path(fuzz.__file__)


def test_fuzz_smoke() -> None:
    report = fuzz.run_fuzz(5_000, seed=20_240_611, probe_every=1_000)
    print(report.summary())
    assert report.frames_sent >= 5_000
    assert report.server_crashes == 0
    assert report.health_probes_failed == 0
    assert report.server_unexpected_log == []
    assert report.wellbehaved_ops_failed == 0, report.wellbehaved_failures
    assert report.wellbehaved_ops_done > 100
    # The hostile frames were noticed, and every close the fuzzer saw was one the server chose.
    assert report.connections_closed_by_server > 100
    assert report.connections_closed_by_server <= report.server_close_log_lines
    # The server's own count of protocol errors agrees with its log.
    assert report.server_protocol_errors == report.server_close_log_lines
    assert report.connections_opened > report.connections_closed_by_server
    assert 0 < report.peak_server_rss_kib < 256 * 1024
    assert report.ok


def test_frames_are_a_function_of_the_seed() -> None:
    def frames(seed: int) -> list[bytes]:
        maker = fuzz.FrameMaker(random.Random(seed))
        return [maker.frame(hostility) for hostility in (0.0, 0.5, 1.0) * 200]

    assert frames(7) == frames(7)
    assert frames(7) != frames(8)


def test_cli_prints_a_json_report() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--frames", "500", "--seed", "3", "--json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["frames_sent"] >= 500
    assert report["server_crashes"] == 0
