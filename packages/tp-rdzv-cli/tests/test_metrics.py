"""The Prometheus exporter, scraped over real HTTP on 127.0.0.1 from a real store server."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tp_rdzv_cli.errors import CommandError
from tp_rdzv_cli.metrics import MetricsServer, serve_metrics
from tp_store import StoreConnectionError, TCPStore

TIMEOUT = 10.0


@pytest.fixture
def master() -> Iterator[TCPStore]:
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT)
    try:
        yield store
    finally:
        store.close()


def scrape(exporter: MetricsServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one scrape, by (sample name, sorted labels)."""
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_counters_of_a_server_in_this_process(master: TCPStore) -> None:
    assert master.server is not None
    exporter = serve_metrics(0, "127.0.0.1", master.server.stats)
    try:
        for _ in range(3):
            master.add("n", 1)
        master.set("k", "v")
        assert master.get("k") == b"v"
        samples = scrape(exporter)
    finally:
        exporter.stop()
    assert samples[("tp_store_up", ())] == 1
    assert samples[("tp_store_operations_total", (("op", "add"),))] == 3
    assert samples[("tp_store_operations_total", (("op", "wait_get"),))] == 1
    assert samples[("tp_store_operations_total", (("op", "barrier"),))] == 0
    assert samples[("tp_store_connections_open", ())] == 1
    assert samples[("tp_store_connections_accepted_total", ())] == 1
    assert samples[("tp_store_connections_protocol_errors_total", ())] == 0
    assert samples[("tp_store_keys", ())] == 2
    assert samples[("tp_store_waiters_parked", ())] == 0
    assert samples[("tp_store_received_bytes_total", ())] > 0
    assert samples[("tp_store_sent_bytes_total", ())] > 0
    assert samples[("tp_store_uptime_seconds", ())] > 0


def test_store_session_counters(master: TCPStore) -> None:
    assert master.server is not None
    exporter = serve_metrics(0, "127.0.0.1", master.server.stats)
    try:
        master.open_session(60).close()
        held = master.open_session(60)
        samples = scrape(exporter)
        held.close()
    finally:
        exporter.stop()
    assert samples[("tp_store_sessions_open", ())] == 1
    assert samples[("tp_store_sessions_opened_total", ())] == 2
    assert samples[("tp_store_sessions_ended_total", (("cause", "closed"),))] == 1
    assert samples[("tp_store_sessions_ended_total", (("cause", "disconnected"),))] == 0
    assert samples[("tp_store_sessions_ended_total", (("cause", "expired"),))] == 0


def test_counters_read_over_the_wire_at_each_scrape(master: TCPStore) -> None:
    client = TCPStore("127.0.0.1", master.port, timeout=TIMEOUT)
    exporter = serve_metrics(0, "127.0.0.1", client.server_stats)
    try:
        first = scrape(exporter)[("tp_store_operations_total", (("op", "stats"),))]
        master.add("n", 1)
        samples = scrape(exporter)
    finally:
        exporter.stop()
        client.close()
    # Each scrape is one STATS request, counted before its answer is written.
    assert samples[("tp_store_operations_total", (("op", "stats"),))] == first + 1 == 2
    assert samples[("tp_store_operations_total", (("op", "add"),))] == 1
    assert samples[("tp_store_connections_open", ())] == 2


def test_a_store_that_cannot_be_read_is_reported_down() -> None:
    def unreachable() -> dict[str, int]:
        raise StoreConnectionError("cannot connect to the store at 127.0.0.1:1", "127.0.0.1", 1)

    exporter = serve_metrics(0, "127.0.0.1", unreachable)
    try:
        samples = scrape(exporter)
    finally:
        exporter.stop()
    assert samples == {("tp_store_up", ()): 0}


def test_stop_closes_the_port(master: TCPStore) -> None:
    assert master.server is not None
    exporter = serve_metrics(0, "127.0.0.1", master.server.stats)
    exporter.stop()
    exporter.stop()  # a second stop does nothing
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=TIMEOUT)


def test_a_taken_port_is_a_clear_error(master: TCPStore) -> None:
    with pytest.raises(CommandError, match=f"cannot serve metrics on 127.0.0.1:{master.port}"):
        serve_metrics(master.port, "127.0.0.1", dict)


def test_without_prometheus_client_the_error_says_what_to_install() -> None:
    # A fresh interpreter in which prometheus_client cannot be imported.
    script = textwrap.dedent(
        """
        import sys
        sys.modules["prometheus_client"] = None
        from tp_rdzv_cli.errors import CommandError, ExitCode
        from tp_rdzv_cli.metrics import serve_metrics
        try:
            serve_metrics(0, "127.0.0.1", dict)
        except CommandError as exc:
            assert exc.code == ExitCode.USAGE
            print(exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "pip install 'tp-rdzv-cli[metrics]'" in result.stdout
