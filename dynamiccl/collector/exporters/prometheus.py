"""Prometheus exporter: a custom ``Collector`` yielding families at scrape time.

State (dynamiccl/collector/exporters/prom_state.py) is cumulative per label set (histograms, counters,
under one series budget) or "last window" (bandwidth, spread, skew gauges, expiring when windows
stop), updated once per window from the aggregator's WindowResult — never per record.
Every name comes from ``dynamiccl.collector.metrics.METRICS``.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable

import numpy as np
from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics, generate_latest

from dynamiccl.collector.component import WindowResult
from dynamiccl.collector.exporters.prom_state import CollectiveState
from dynamiccl.collector.exporters.prom_text import Part, Renderer, to_family
from dynamiccl.collector.config import PrometheusConfig, parse_host_port
from dynamiccl.collector.metrics import BY_NAME, PLUGIN_DROP_REASONS, PluginStats, SelfMetrics

__all__ = ["PrometheusExporter", "MetricsCollector"]

log = logging.getLogger(__name__)
class MetricsCollector:
    """prometheus_client custom collector over the exporter state and the self-counters.

    :meth:`render` writes the same text as ``generate_latest`` over :meth:`collect` (prom_text.py), with
    the collective families, which change once per window, rendered once per window and reused.
    """

    def __init__(self, state: CollectiveState, metrics: SelfMetrics, plugin_stats: PluginStats,
                 queues: dict, version: str, clock: Callable[[], float] = time.monotonic):
        self.state, self.metrics, self.plugin_stats = state, metrics, plugin_stats
        self.queues, self.version = queues, version
        self._clock = clock
        self.last_render: float | None = None              # clock time of the last render() (a scrape)
        self._cached: tuple[tuple, bytes] | None = None   # (state version, gauges fresh) → text
        self._skip = threading.local()
        self._renderer = Renderer()
        self._building = threading.Lock()

    def collect(self):
        if getattr(self._skip, "on", False):   # this thread is serving render() already
            return
        for part in self._self_parts() + self._plugin_parts() + self._collective_parts():
            yield to_family(part)

    @contextmanager
    def rendered_apart(self):
        """While inside, :meth:`collect` yields nothing in this thread (its text comes from :meth:`render`)."""
        self._skip.on = True
        try:
            yield
        finally:
            self._skip.on = False

    def render(self) -> bytes:
        """The text of :meth:`collect`; the collective part is rebuilt only when a window changed it."""
        self.last_render = self._clock()
        return self._renderer.render(self._self_parts() + self._plugin_parts()) + self.collective_text()

    def collective_text(self) -> bytes:
        """The collective families' text, rebuilt only when the state changed since the last build.
        One build at a time: while another thread (the window thread rendering ahead) builds, a caller
        gets the previous text, one window old, instead of waiting or building it a second time."""
        key = self.state.render_key()
        cached = self._cached
        if cached is not None and cached[0] == key:
            return cached[1]
        if not self._building.acquire(blocking=cached is None):
            return cached[1]
        try:
            cached = self._cached
            if cached is None or cached[0] != key:
                cached = self._cached = (key, self._renderer.render(self._collective_parts()))
            return cached[1]
        finally:
            self._building.release()

    def _self_parts(self) -> list[Part]:
        m = self.metrics
        with m._lock:
            simple = {
                "dynamiccl_collector_records_received_total": m.received,
                "dynamiccl_collector_records_decoded_total": m.decoded,
                "dynamiccl_collector_records_aggregated_total": m.aggregated,
                "dynamiccl_collector_windows_emitted_total": m.windows_emitted,
                "dynamiccl_collector_connections_open": m.connections_open,
                "dynamiccl_collector_parquet_files_written_total": m.parquet_files,
                "dynamiccl_collector_parquet_rows_written_total": m.parquet_rows,
                "dynamiccl_collector_parquet_write_errors_total": m.parquet_errors,
                "dynamiccl_collector_parquet_writer_deaths_total": m.parquet_writer_deaths,
                "dynamiccl_collector_feature_subscribers": m.feature_subscribers,
                "dynamiccl_collector_feature_windows_dropped_total": m.feature_windows_dropped,
                "dynamiccl_collector_records_unconfirmed_total": m.records_unconfirmed,
                "dynamiccl_collector_clock_steps_total": m.clock_steps,
                "dynamiccl_collector_clock_corrected_records_total": m.clock_corrected,
                "dynamiccl_collector_last_window_end_timestamp_seconds": m.last_window_end_s,
                "dynamiccl_collector_wait_lossy_folded_records_total": m.wait_lossy_folded,
            }
            tables = {
                "dynamiccl_collector_records_dropped_total": dict(m.dropped),
                "dynamiccl_collector_malformed_frames_total": dict(m.malformed),
                "dynamiccl_collector_connections_total": dict(m.connections_total),
                "dynamiccl_collector_connections_refused_total": dict(m.refusals),
                "dynamiccl_collector_wait_instances_total": dict(m.wait),
                "dynamiccl_collector_durations_refused_total": dict(m.durations_refused),
                "dynamiccl_collector_wait_withheld_lossy_total": dict(m.wait_lossy),
                "dynamiccl_collector_wait_withheld_lossy_scope_total": dict(m.wait_lossy_scope),
                "dynamiccl_collector_wait_lossy_records_total": dict(m.wait_lossy_cause),
            }
            pairs = {
                "dynamiccl_collector_delivery_gap_records_total": dict(m.gap_records),
                "dynamiccl_collector_delivery_gaps_total": dict(m.gaps),
            }
            jobs = dict(m.job_connections)
        parts = [Part(BY_NAME[n], [((), v)]) for n, v in simple.items()]
        parts += [Part(BY_NAME[n], [((label,), v) for label, v in sorted(t.items())]) for n, t in tables.items()]
        parts += [Part(BY_NAME[n], sorted(t.items())) for n, t in pairs.items()]
        parts.append(Part(BY_NAME["dynamiccl_collector_queue_records"],
                          [((qname,), q.pending) for qname, q in self.queues.items()]))
        parts.append(Part(BY_NAME["dynamiccl_plugin_connections_open"], sorted(jobs.items())))
        parts.append(Part(BY_NAME["dynamiccl_build_info"], [((self.version,), 1)]))
        return parts

    def _plugin_parts(self) -> list[Part]:
        totals = sorted(self.plugin_stats.totals().items())
        return [
            Part(BY_NAME["dynamiccl_plugin_records_dropped_total"],
                 [((job, host, reason), v[field]) for (job, host), v in totals
                  for reason, field in PLUGIN_DROP_REASONS.items()]),
            Part(BY_NAME["dynamiccl_plugin_records_sent_total"], [(k, v["records_sent"]) for k, v in totals]),
            Part(BY_NAME["dynamiccl_plugin_reconnects_total"], [(k, v["reconnects"]) for k, v in totals]),
            Part(BY_NAME["dynamiccl_plugin_sampled_out_total"], [(k, v["sampled_out"]) for k, v in totals]),
        ]

    def _collective_parts(self) -> list[Part]:
        s = self.state
        with s.lock:
            hist = [(k, np.cumsum(v[0]), v[1]) for k, v in s.hist.items()]
            gauges = s.gauges()
            tables = {
                "dynamiccl_collectives_total": dict(s.colls),
                "dynamiccl_collective_bytes_total": dict(s.bytes),
                "dynamiccl_bus_bandwidth_bytes_per_second": gauges["busbw"],
                "dynamiccl_algorithm_bandwidth_bytes_per_second": gauges["algbw"],
                "dynamiccl_collective_spread_seconds": gauges["spread"],
                "dynamiccl_rank_skew_seconds": gauges["skew"],
                "dynamiccl_last_event_timestamp_seconds": dict(s.last_event),
            }
            series_dropped = s.series_dropped
        hist = [(k, cum.tolist(), total) for k, cum, total in hist]
        return ([Part(BY_NAME["dynamiccl_collective_duration_seconds"], hist)]
                + [Part(BY_NAME[n], list(t.items())) for n, t in tables.items()]
                + [Part(BY_NAME["dynamiccl_collector_series_dropped_total"], [((), series_dropped)])])


def _ready_for_serving(registry: CollectorRegistry) -> None:
    """``process_*`` metrics on the served registry and no ``_created`` series, as the detector and
    retuner do (dynamiccl.detector.metrics.export_process_metrics). The collector's own families never carry
    ``_created``; the switch is process-wide and covers any client-library metric registered here."""
    disable_created_metrics()
    try:
        ProcessCollector(registry=registry)
    except ValueError:   # "Duplicated timeseries": the registry already exports process_*
        pass


class PrometheusExporter:
    """Exporter: consumes WindowResult; serves ``/metrics`` on ``config.address`` if set."""

    def __init__(self, config: PrometheusConfig, *, metrics: SelfMetrics,
                 plugin_stats: PluginStats | None = None, registry: CollectorRegistry | None = None,
                 queues: dict | None = None, version: str = "0",
                 clock: Callable[[], float] = time.monotonic):
        config.validate()
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self._metrics = metrics
        self.state = CollectiveState(max_series=config.max_series, max_window_series=config.max_window_series,
                                     series_min_idle_s=config.series_min_idle_s,
                                     gauge_ttl_s=config.gauge_ttl_s, clock=clock)
        self.collector = MetricsCollector(self.state, metrics, plugin_stats or PluginStats(),
                                          queues if queues is not None else {}, version, clock=clock)
        self._clock = clock
        self.registry.register(self.collector)
        self._httpd = None
        self._thread = None
        self.address: str | None = None

    def start(self) -> None:
        if self._httpd is not None or self.config.address is None:
            return
        from dynamiccl.collector.exporters.http_metrics import start_metrics_server
        host, port = parse_host_port(self.config.address, key="metrics")
        _ready_for_serving(self.registry)
        try:
            self._httpd, self._thread = start_metrics_server(
                host, port, self.body, max_clients=self.config.max_clients,
                request_timeout_s=self.config.request_timeout_s, on_refuse=self._metrics.refused)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics {self.config.address}: cannot listen: {exc.strerror or exc}") from exc
        bound = self._httpd.server_address
        self.address = f"{bound[0]}:{bound[1]}"
        log.info("serving /metrics on http://%s/metrics", self.address)

    def body(self) -> bytes:
        """What ``/metrics`` serves: this exporter's families (fast text), then the registry's other
        collectors (process, GPU telemetry) through prometheus_client."""
        own = self.collector.render()
        with self.collector.rendered_apart():
            return own + generate_latest(self.registry)

    def consume(self, result: WindowResult) -> None:
        self.state.update(result)
        last = self.collector.last_render
        if last is not None and self._clock() - last <= self.config.render_ahead_s:
            self.collector.collective_text()   # on this (window) thread: the next scrape only sends bytes

    def shutdown(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
            self._thread = None
