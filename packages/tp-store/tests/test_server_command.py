"""``python -m tp_store`` turns bad options into one line, never a traceback."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

_MEMORY_BOUND = 1 << 30  # a server that reads /dev/zero whole fails fast under it


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_BOUND, _MEMORY_BOUND))


def _run(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tp_store", "--port", "0", *options],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=_limit_memory,
    )


def test_an_unknown_log_level_is_a_usage_error() -> None:
    result = _run("--log-level", "foo")
    assert result.returncode == 2
    assert "argument --log-level: invalid level 'foo'" in result.stderr
    assert "WARNING" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_endless_secret_file_is_refused_in_one_line() -> None:
    result = _run("--secret-file", "/dev/zero")
    assert result.returncode == 1
    assert result.stderr == "error: the store secret file '/dev/zero' is not a regular file\n"


@pytest.mark.parametrize("backlog", ["0", "99999999999999999999"])
def test_a_backlog_out_of_range_is_one_line(backlog: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tp_store", "--port", "0", "--backlog", backlog],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == f"error: backlog must be in 1..2147483647, got {backlog}"
