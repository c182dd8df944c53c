"""Prometheus exporter: a custom ``Collector`` yielding families at scrape time.

State is cumulative per label set (histograms, counters) or "last window" (bandwidth, spread,
skew gauges), updated once per window from the aggregator's WindowResult — never per record.
Every name comes from ``collector.metrics.METRICS``.
"""
from __future__ import annotations

import logging
import threading

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from collector.component import WindowResult
from collector.config import PrometheusConfig, parse_host_port
from collector.metrics import (
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


class _State:
    def __init__(self, max_series: int):
        self.max_series = max_series
        self.lock = threading.Lock()
        self.hist: dict[tuple, list] = {}        # labels → [counts(22), sum]
        self.colls: dict[tuple, int] = {}
        self.bytes: dict[tuple, int] = {}
        self.last_event: dict[tuple, float] = {}
        self.busbw: dict[tuple, float] = {}
        self.algbw: dict[tuple, float] = {}
        self.spread: dict[tuple, float] = {}
        self.skew: dict[tuple, float] = {}
        self.series_dropped = 0

    def _slot(self, table: dict, key: tuple, init):
        v = table.get(key)
        if v is None:
            if len(table) >= self.max_series:
                self.series_dropped += 1
                return None
            v = table[key] = init()
        return v

    def update(self, r: WindowResult) -> None:
        h = r.histograms
        n = len(h["counts"])
        with self.lock:
            for i in range(n):  # one row per (label set) in the window: bounded by max_series
                labels = (h["job_id"][i], h["host"][i], h["comm"][i], h["func"][i], h["algo"][i],
                          h["proto"][i], str(int(h["size_bucket"][i])))
                slot = self._slot(self.hist, labels, lambda: [np.zeros(len(_LE), np.int64), 0.0])
                if slot is not None:
                    slot[0] += h["counts"][i]
                    slot[1] += float(h["sum_s"][i])
                ck = (labels[0], labels[2], labels[3], labels[4], labels[5])
                if self._slot(self.colls, ck, int) is not None:
                    self.colls[ck] += int(h["records"][i])
                bk = (labels[0], labels[2], labels[3])
                if self._slot(self.bytes, bk, int) is not None:
                    self.bytes[bk] += int(round(h["bytes"][i]))
            for job, host, rank, t in r.last_event.iter_rows():
                k = (job, host, str(rank))
                if t > self.last_event.get(k, 0.0) and self._slot(self.last_event, k, float) is not None:
                    self.last_event[k] = t
            keys = r.features.keys
            self.busbw, self.algbw, self.spread = {}, {}, {}
            if keys.height:
                import polars as pl
                comm = pl.when(pl.col("comm_name") != "").then(pl.col("comm_name")).otherwise(
                    pl.col("comm_hash").map_elements(lambda v: f"{v:016x}", return_dtype=pl.String))
                g = keys.with_columns(comm=comm).group_by("job_id", "comm", "func", "size_bucket").agg(
                    busbw=(pl.col("busbw_Bps") * pl.col("records")).sum() / pl.col("records").filter(
                        pl.col("busbw_Bps").is_not_null()).sum(),
                    algbw=(pl.col("algbw_Bps") * pl.col("records")).sum() / pl.col("records").filter(
                        pl.col("algbw_Bps").is_not_null()).sum(),
                    spread=pl.col("spread_max_s").max())
                for job, cm, func, sb, bus, alg, spr in g.iter_rows():
                    k = (job, cm, func, str(sb))
                    if bus is not None and np.isfinite(bus):
                        self.busbw[k] = bus
                    if alg is not None and np.isfinite(alg):
                        self.algbw[k] = alg
                    if spr is not None:
                        self.spread[k] = spr
            self.skew = {(job, cm, str(rank)): s for job, cm, rank, s in r.skew.iter_rows()
                         if s is not None}


class MetricsCollector:
    """prometheus_client custom collector over the exporter state and the self-counters."""

    def __init__(self, state: _State, metrics: SelfMetrics, plugin_stats: PluginStats,
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
                "dynamiccl_collector_last_window_end_timestamp_seconds": m.last_window_end_s,
            }
            dropped, malformed, refusals = dict(m.dropped), dict(m.malformed), dict(m.refusals)
            gap_records, gaps = dict(m.gap_records), dict(m.gaps)
            conns = dict(m.connections_total)
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
            tables = {
                "dynamiccl_collectives_total": dict(s.colls),
                "dynamiccl_collective_bytes_total": dict(s.bytes),
                "dynamiccl_bus_bandwidth_bytes_per_second": dict(s.busbw),
                "dynamiccl_algorithm_bandwidth_bytes_per_second": dict(s.algbw),
                "dynamiccl_collective_spread_seconds": dict(s.spread),
                "dynamiccl_rank_skew_seconds": dict(s.skew),
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


class PrometheusExporter:
    """Exporter: consumes WindowResult; serves ``/metrics`` on ``config.address`` if set."""

    def __init__(self, config: PrometheusConfig, *, metrics: SelfMetrics,
                 plugin_stats: PluginStats | None = None, registry: CollectorRegistry | None = None,
                 queues: dict | None = None, version: str = "0"):
        config.validate()
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.state = _State(config.max_series)
        self.collector = MetricsCollector(self.state, metrics, plugin_stats or PluginStats(),
                                          queues if queues is not None else {}, version)
        self.registry.register(self.collector)
        self._httpd = None
        self._thread = None
        self.address: str | None = None

    def start(self) -> None:
        if self._httpd is not None or self.config.address is None:
            return
        from prometheus_client import start_http_server
        host, port = parse_host_port(self.config.address, key="metrics")
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=self.registry)
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
