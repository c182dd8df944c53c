"""Prometheus exporter: a custom ``Collector`` yielding families at scrape time.

State (dynamiccl/collector/exporters/prom_state.py) is cumulative per label set (histograms, counters,
under one series budget) or "last window" (bandwidth, spread, skew gauges, expiring when windows
stop), updated once per window from the aggregator's WindowResult — never per record.
Every name comes from ``dynamiccl.collector.metrics.METRICS``.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np
from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from dynamiccl.collector.component import WindowResult
from dynamiccl.collector.exporters.prom_state import CollectiveState
from dynamiccl.collector.config import PrometheusConfig, parse_host_port
from dynamiccl.collector.metrics import (
    BY_NAME, DURATION_BUCKETS_S, PLUGIN_DROP_REASONS, PluginStats, SelfMetrics,
)

__all__ = ["PrometheusExporter", "MetricsCollector"]

log = logging.getLogger(__name__)
_LE = [repr(float(b)) for b in DURATION_BUCKETS_S] + ["+Inf"]


def _fam(name: str):
    spec = BY_NAME[name]
    cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
           "histogram": HistogramMetricFamily}[spec.type]
    return cls(name, spec.help, labels=list(spec.labels))


class MetricsCollector:
    """prometheus_client custom collector over the exporter state and the self-counters."""

    def __init__(self, state: CollectiveState, metrics: SelfMetrics, plugin_stats: PluginStats,
                 queues: dict, version: str):
        self.state, self.metrics, self.plugin_stats = state, metrics, plugin_stats
        self.queues, self.version = queues, version

    def collect(self):
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
                "dynamiccl_collector_last_window_end_timestamp_seconds": m.last_window_end_s,
            }
            dropped, malformed, refusals = dict(m.dropped), dict(m.malformed), dict(m.refusals)
            gap_records, gaps = dict(m.gap_records), dict(m.gaps)
            conns = dict(m.connections_total)
            jobs = dict(m.job_connections)
        for name, value in simple.items():
            f = _fam(name)
            f.add_metric([], value)
            yield f
        for name, table in (("dynamiccl_collector_records_dropped_total", dropped),
                            ("dynamiccl_collector_malformed_frames_total", malformed),
                            ("dynamiccl_collector_connections_total", conns),
                            ("dynamiccl_collector_connections_refused_total", refusals)):
            f = _fam(name)
            for label, value in sorted(table.items()):
                f.add_metric([label], value)
            yield f
        for name, table in (("dynamiccl_collector_delivery_gap_records_total", gap_records),
                            ("dynamiccl_collector_delivery_gaps_total", gaps)):
            f = _fam(name)
            for (job, host), value in sorted(table.items()):
                f.add_metric([job, host], value)
            yield f
        f = _fam("dynamiccl_collector_queue_records")
        for qname, q in self.queues.items():
            f.add_metric([qname], q.pending)
        yield f
        f = _fam("dynamiccl_plugin_connections_open")
        for (job, host), n in sorted(jobs.items()):
            f.add_metric([job, host], n)
        yield f
        f = _fam("dynamiccl_build_info")
        f.add_metric([self.version], 1)
        yield f
        yield from self._plugin()
        yield from self._collectives()

    def _plugin(self):
        totals = self.plugin_stats.totals()
        drop = _fam("dynamiccl_plugin_records_dropped_total")
        sent = _fam("dynamiccl_plugin_records_sent_total")
        rec = _fam("dynamiccl_plugin_reconnects_total")
        samp = _fam("dynamiccl_plugin_sampled_out_total")
        for (job, host), v in sorted(totals.items()):
            for reason, fieldname in PLUGIN_DROP_REASONS.items():
                drop.add_metric([job, host, reason], v[fieldname])
            sent.add_metric([job, host], v["records_sent"])
            rec.add_metric([job, host], v["reconnects"])
            samp.add_metric([job, host], v["sampled_out"])
        yield from (drop, sent, rec, samp)

    def _collectives(self):
        s = self.state
        with s.lock:
            hist = [(k, v[0].copy(), v[1]) for k, v in s.hist.items()]
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
        f = _fam("dynamiccl_collective_duration_seconds")
        for labels, counts, total in hist:
            cum = np.cumsum(counts)
            f.add_metric(list(labels), list(zip(_LE, cum.tolist())), sum_value=total)
        yield f
        for name, table in tables.items():
            f = _fam(name)
            for labels, value in table.items():
                f.add_metric(list(labels), value)
            yield f
        f = _fam("dynamiccl_collector_series_dropped_total")
        f.add_metric([], series_dropped)
        yield f


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
                                          queues if queues is not None else {}, version)
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
                host, port, self.registry, max_clients=self.config.max_clients,
                request_timeout_s=self.config.request_timeout_s, on_refuse=self._metrics.refused)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics {self.config.address}: cannot listen: {exc.strerror or exc}") from exc
        bound = self._httpd.server_address
        self.address = f"{bound[0]}:{bound[1]}"
        log.info("serving /metrics on http://%s/metrics", self.address)

    def consume(self, result: WindowResult) -> None:
        self.state.update(result)

    def shutdown(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
            self._thread = None
