"""Test policy of the whole repository: where etcd is required, a skipped etcd test fails.

The nox sessions that run etcd suites (the README's test command) set
``TP_REQUIRE_ETCD=1`` and CI sets ``CI=true``: there, a test marked ``etcd``
that skips (no etcd binary, a binary that does not start) is reported as a
failure, so no run passes without having run them. A developer who runs one
test file by hand without etcd still gets the skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def _etcd_required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("TP_REQUIRE_ETCD") == "1"


def pytest_report_header() -> str | None:
    return "etcd required: a skipped etcd test fails" if _etcd_required() else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and _etcd_required() and item.get_closest_marker("etcd") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"etcd is required here (CI=true or TP_REQUIRE_ETCD=1), yet: {reason}"
