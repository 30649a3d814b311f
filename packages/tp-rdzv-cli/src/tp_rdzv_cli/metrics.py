"""Prometheus metrics of a store server (``tp-rdzv store --metrics-port``).

:func:`serve_metrics` serves ``/metrics`` over HTTP from a collector that
calls ``read_stats`` at every scrape, so nothing is sampled in between: pass
``StoreServer.stats`` for a server in this process, or ``TCPStore.server_stats``
for one across the network. The metrics, all prefixed ``tp_store_``:

- gauges ``connections_open``, ``waiters_parked``, ``keys``, ``uptime_seconds``,
  ``sessions_open``;
- counters ``connections_accepted_total``, ``connections_protocol_errors_total``,
  ``connections_refused_total``, ``connections_timed_out_total``,
  ``connections_auth_failures_total``, ``received_bytes_total``,
  ``sent_bytes_total``, ``sessions_opened_total``, ``operations_total`` with
  the label ``op`` (the lower-case request name: ``set``, ``wait_get``...)
  and ``sessions_ended_total`` with the label ``cause`` (``closed``,
  ``disconnected``, ``expired``);
- the gauge ``up``: 1 when the counters could be read, else 0 (and nothing else).

It needs ``prometheus-client``, the optional extra ``tp-rdzv-cli[metrics]``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIServer

from .errors import CommandError, ExitCode

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # the extra is not installed: serve_metrics says how to get it
    _missing: ImportError | None = exc
else:
    _missing = None

log = logging.getLogger(__name__)

#: The prefix of every metric name.
PREFIX = "tp_store_"

#: Gauges: (field of the stats document, metric name after the prefix, help).
_GAUGES = (
    ("connections_open", "connections_open", "Client connections open now."),
    ("waiters_parked", "waiters_parked", "Clients parked now in WAIT, WAIT_GET or BARRIER."),
    ("keys", "keys", "Keys stored now."),
    ("uptime_seconds", "uptime_seconds", "Seconds since the store server started listening."),
    ("sessions_open", "sessions_open", "Store sessions open now."),
)
#: Counters, likewise (the client library appends ``_total`` to the name).
_COUNTERS = (
    ("connections_accepted", "connections_accepted", "Client connections accepted."),
    (
        "connections_protocol_errors",
        "connections_protocol_errors",
        "Connections closed by the server because of a protocol error.",
    ),
    (
        "connections_refused",
        "connections_refused",
        "Connections refused because the server had max_connections open.",
    ),
    (
        "connections_timed_out",
        "connections_timed_out",
        "Connections closed because a request made no progress within request_timeout.",
    ),
    (
        "connections_auth_failures",
        "connections_auth_failures",
        "Connections closed because they failed to authenticate.",
    ),
    ("bytes_received", "received_bytes", "Bytes received from clients."),
    ("bytes_sent", "sent_bytes", "Bytes of replies sent to clients."),
    ("sessions_opened", "sessions_opened", "Store sessions opened."),
)
#: Why store sessions end: the label of ``sessions_ended_total`` (field ``sessions_ended_<cause>``).
_SESSION_END_CAUSES = ("closed", "disconnected", "expired")


class _StoreCollector:
    """A Prometheus collector that reads the store's counters at scrape time."""

    def __init__(self, read_stats: Callable[[], Mapping[str, Any]]) -> None:
        self._read_stats = read_stats

    def collect(self) -> Iterator[Metric]:
        """The metrics of one scrape."""
        up = GaugeMetricFamily(PREFIX + "up", "1 if the store's counters could be read, else 0.")
        try:
            stats = self._read_stats()
        # What a store read raises: StoreError is a RuntimeError, a lost or
        # refused connection an OSError, a malformed answer a ValueError.
        except (OSError, RuntimeError, ValueError) as exc:
            log.warning("cannot read the store's statistics: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        # A field an older server does not send is left out rather than faked.
        for field, name, text in _GAUGES:
            if field in stats:
                yield GaugeMetricFamily(PREFIX + name, text, value=stats[field])
        for field, name, text in _COUNTERS:
            if field in stats:
                yield CounterMetricFamily(PREFIX + name, text, value=stats[field])
        operations = CounterMetricFamily(
            PREFIX + "operations", "Requests received, by request type.", labels=["op"]
        )
        for op, count in sorted(stats.get("ops", {}).items()):
            operations.add_metric([op], count)
        yield operations
        if "sessions_opened" in stats:
            ended = CounterMetricFamily(
                PREFIX + "sessions_ended", "Store sessions ended, by cause.", labels=["cause"]
            )
            for cause in _SESSION_END_CAUSES:
                ended.add_metric([cause], stats.get(f"sessions_ended_{cause}", 0))
            yield ended


class MetricsServer:
    """The HTTP server of :func:`serve_metrics`, on a daemon thread until :meth:`stop`."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self._stopped = False

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when 0 was asked)."""
        port: int = self._httpd.server_address[1]
        return port

    def stop(self) -> None:
        """Stop serving and close the socket (again: nothing)."""
        if self._stopped:
            return
        self._stopped = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


def serve_metrics(
    port: int, host: str, read_stats: Callable[[], Mapping[str, Any]]
) -> MetricsServer:
    """Serve the counters ``read_stats`` returns as Prometheus metrics on ``host:port``.

    ``port`` 0 picks a free port (read it from :attr:`MetricsServer.port`);
    ``host`` ``""`` means every IPv4 interface. ``read_stats`` is called on
    the HTTP server's thread at every scrape and returns a document shaped
    like ``tp_store.ServerStats``; when it raises a store or connection
    error, the scrape reports ``tp_store_up 0``.

    Raises :class:`CommandError` if ``prometheus-client`` is not installed
    or the address cannot be bound.
    """
    if _missing is not None:
        raise CommandError(
            f"Prometheus metrics need prometheus-client ({_missing}): "
            "pip install 'tp-rdzv-cli[metrics]'",
            ExitCode.USAGE,
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StoreCollector(read_stats))
    address = host or "0.0.0.0"
    try:
        httpd, thread = start_http_server(port, address, registry)
    except OSError as exc:
        raise CommandError(
            f"cannot serve metrics on {address}:{port}: {exc}", ExitCode.FAILED
        ) from exc
    return MetricsServer(httpd, thread)
