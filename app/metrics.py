"""The Prometheus endpoint (issue 36): what a scrape of the scheduler (`rubricem scheduler`) or of
`rubricem mcp --transport http` returns. (The Streamlit UI has no HTTP route of its own to serve one.)

A scrape answers two kinds of metrics:

- **This process's instruments** (`agent.telemetry`, prometheus_client's default registry): stage, policy, tool and
  judge latency histograms, token and error counters, `rubricem_sessions_finished_total` and
  `rubricem_retrain_cycles_total` — what *this process* did since it started (they start at 0 on a restart).
- **The store's state**, read at scrape time by `StoreCollector` (one small query per family, never a session's
  rows), the same from every process on one store:
  - `rubricem_store_sessions{status}` (gauge): sessions by shown status: running, awaiting_approval (paused for a
    plan approval or a clarifying answer), interrupted (checkpointed, its process gone: `rubricem resume`),
    completed, failed;
  - `rubricem_store_retrain_cycles_total{outcome}` (counter): cycles the registry recorded, by outcome (promoted,
    rejected, skipped, failed), whichever process ran them;
  - `rubricem_store_retrain_cycle_running` (gauge): 1 while a cycle is recorded as running (or a crash left one so);
  - `rubricem_live_policy_info{version}` (info, value 1): the version the registry's `live` alias points at, and
    `rubricem_live_policy_number` (gauge) its N (`policy@N`; 0 is `base`);
  - `rubricem_store_up` (gauge): 1 when the store answered this scrape, 0 when it did not (the rest is still served).

  Two processes on one store both report these: aggregate them with `max` (e.g.
  `max by (status) (rubricem_store_sessions)`), not `sum`.

The process-local `rubricem_retrain_cycles_total` counts the cycles this process ran (the scheduler's); the store's
`rubricem_store_retrain_cycles_total` counts every recorded cycle, `rubricem retrain --now` from a shell included.

The scheduler's endpoint answers only requests whose Host header is one of its own names (and whose Origin, when
sent, is too): the MCP server's rule (`app.hostcheck`, issue 46), so a web page cannot read it through a DNS name
rebound to its address.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

import agent.telemetry  # noqa: F401 - defines the process's instruments in the default registry
from app.hostcheck import HostRule
from store.session_log import SessionLog

_log = logging.getLogger(__name__)

SESSION_STATUSES = ("running", "awaiting_approval", "interrupted", "completed", "failed")
CYCLE_OUTCOMES = ("promoted", "rejected", "skipped", "failed")
METRICS_PATH = "/metrics"


class StoreCollector:
    """The store's gauges and counters, read from `log` at each scrape (the table above).

    Bounded cost: a COUNT GROUP BY over the sessions' (status, finished_at) index, a join over the running sessions
    only (few), a GROUP BY over the cycles' status index and one row for `live`. A store that fails to answer is
    logged and reported as `rubricem_store_up 0`; it never fails the scrape of the process's own instruments.
    """

    def __init__(self, log: SessionLog) -> None:
        self.log = log

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (what the registry checks names against; no store access)."""
        yield from _Families()

    def collect(self) -> Iterator[Metric]:
        """One reading of the store."""
        f = _Families()
        try:
            counts = self._read()
        except Exception as exc:  # noqa: BLE001 - a store that is down is reported, not raised into the scrape
            _log.warning("metrics: the store did not answer the scrape: %s: %s", type(exc).__name__, exc)
            f.up.add_metric([], 0)
            yield f.up
            return
        for status in SESSION_STATUSES:  # every status, zeros included: a panel shows 0, not "no data"
            f.sessions.add_metric([status], counts.sessions.get(status, 0))
        for outcome in CYCLE_OUTCOMES:
            f.cycles.add_metric([outcome], counts.cycles.get(outcome, 0))
        f.running.add_metric([], counts.cycles.get("running", 0))
        f.live.add_metric([], {"version": counts.live})
        f.live_number.add_metric([], counts.live_number)
        f.up.add_metric([], 1)
        yield from f

    def _read(self) -> _StoreCounts:
        now = self.log.now()
        with self.log.transaction(write=False) as conn:
            by_status = conn.execute("SELECT status, COUNT(*) FROM sessions GROUP BY status").fetchall()
            # Running sessions only (few): paused ones, and checkpointed ones whose lease lapsed, are shown apart,
            # as `rubricem sessions list` shows them (store.session_log.sessions._interrupted).
            running = conn.execute(
                "SELECT state, lapsed, COUNT(*) FROM (SELECT COALESCE(r.state, '') AS state, CASE WHEN "
                "s.lease_until IS NULL OR s.lease_until <= ? THEN 1 ELSE 0 END AS lapsed FROM sessions s "
                "LEFT JOIN session_runs r ON r.session_id = s.session_id WHERE s.status = 'running') t "
                "GROUP BY state, lapsed", (now,)).fetchall()
            cycles = conn.execute("SELECT status, COUNT(*) FROM retrain_cycles GROUP BY status").fetchall()
            live = conn.execute("SELECT a.version, v.number FROM policy_aliases a JOIN policy_versions v "
                                "ON v.name = a.version WHERE a.alias = 'live'").fetchone()
        sessions = {str(status): int(n) for status, n in by_status if status != "running"}
        for state, lapsed, n in running:
            shown = ("awaiting_approval" if state == "awaiting_approval"
                     else "interrupted" if state == "active" and int(lapsed) else "running")
            sessions[shown] = sessions.get(shown, 0) + int(n)
        # No live row yet: the registry makes `base` live on first use, so that is what is served.
        name, number = (str(live[0]), int(live[1])) if live is not None else ("base", 0)
        return _StoreCounts(sessions, {str(s): int(n) for s, n in cycles}, name, number)


class _Families:
    """The store's metric families, empty (filled by one collect)."""

    def __init__(self) -> None:
        self.sessions = GaugeMetricFamily("rubricem_store_sessions", "Sessions in the store by shown status.",
                                          labels=["status"])
        self.cycles = CounterMetricFamily("rubricem_store_retrain_cycles", "Retrain cycles recorded in the registry "
                                          "by outcome, whichever process ran them.", labels=["outcome"])
        self.running = GaugeMetricFamily("rubricem_store_retrain_cycle_running", "1 while a retrain cycle is "
                                         "recorded as running.")
        self.live = InfoMetricFamily("rubricem_live_policy", "The policy version the registry's live alias points at.")
        self.live_number = GaugeMetricFamily("rubricem_live_policy_number", "N of the live version policy@N "
                                             "(0: base).")
        self.up = GaugeMetricFamily("rubricem_store_up", "Whether the store answered this scrape (1) or not (0).")

    def __iter__(self) -> Iterator[Metric]:
        return iter((self.sessions, self.cycles, self.running, self.live, self.live_number, self.up))


@dataclass(frozen=True, slots=True)
class _StoreCounts:
    sessions: dict[str, int]
    cycles: dict[str, int]
    live: str
    live_number: int


class _ProcessInstruments:
    """prometheus_client's default registry (this process's instruments and its process/GC collectors), as one
    collector of a registry of our own."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def metrics_registry(log: SessionLog) -> CollectorRegistry:
    """What a scrape returns: this process's instruments plus the store's state read from `log`."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_ProcessInstruments())  # type: ignore[arg-type]
    registry.register(StoreCollector(log))  # type: ignore[arg-type]
    return registry


class MetricsPortInUse(OSError):
    """The metrics endpoint's address is taken (or cannot be bound); the message names the settings."""


@dataclass
class MetricsServer:
    """A running Prometheus endpoint (prometheus_client's threaded WSGI server, on a daemon thread)."""

    host: str
    port: int
    _httpd: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{METRICS_PATH}"

    def close(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def host_checked(app: WSGIApp, rule: HostRule) -> WSGIApp:
    """`app` behind `rule`: a request with a foreign Host (421) or Origin (403) gets a short refusal, no metrics."""
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        refusal = rule.refusal(environ.get("HTTP_HOST"), environ.get("HTTP_ORIGIN"))
        if refusal is None:
            return app(environ, start_response)
        phrase = "Misdirected Request" if refusal.status == 421 else "Forbidden"
        start_response(f"{refusal.status} {phrase}", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"{refusal.reason}\n".encode()]

    return guarded


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape (prometheus_client's own server is silent too)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def start_metrics_server(registry: CollectorRegistry, host: str, port: int, rule: HostRule) -> MetricsServer:
    """Serve `registry` on http://host:port/metrics (any path answers; /metrics is the one to scrape) to requests
    `rule` lets through: prometheus_client's threaded WSGI server, with the Host check in front of its app from the
    first request on.

    Raises:
        MetricsPortInUse: the address is in use or cannot be bound, naming RUBRICEM_TELEMETRY__METRICS_HOST and
            RUBRICEM_TELEMETRY__METRICS_PORT (0 turns the endpoint off).
    """
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]

        class Server(ThreadingWSGIServer):
            address_family = family  # an IPv6 bind needs an IPv6 socket

        httpd = make_server(str(sockaddr[0]), port, host_checked(make_wsgi_app(registry), rule), Server,
                            handler_class=_QuietHandler)
    except OSError as exc:
        why = "is in use by another process" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
        raise MetricsPortInUse(
            f"the Prometheus endpoint {host}:{port} {why}: set RUBRICEM_TELEMETRY__METRICS_PORT to a free port "
            "(0 turns the endpoint off) or RUBRICEM_TELEMETRY__METRICS_HOST to another address") from exc
    thread = threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True)
    thread.start()
    bound = int(httpd.server_address[1])
    _log.info("metrics: Prometheus can scrape http://%s:%d%s", host, bound, METRICS_PATH)
    return MetricsServer(host, bound, httpd, thread)
