"""Every metric the collector exposes, declared once: name, type, help, labels.

Dashboards and alert rules are checked against :data:`METRICS`. Names follow
shared/reference/monitoring-conventions.md: ``dynamiccl_`` prefix, base units, ``_total`` on
counters, classic histograms with log2 buckets, no ``rank`` label on histograms, no label
called ``job``/``instance``.

This module also holds the collector's self-counters (:class:`SelfMetrics`) and the table of
plugin STATS values (:class:`PluginStats`); both are read at scrape time.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

__all__ = [
    "MetricSpec", "METRICS", "BY_NAME", "DURATION_BUCKETS_S", "DROP_REASONS", "MALFORMED_REASONS",
    "PLUGIN_DROP_REASONS", "REFUSAL_REASONS", "SelfMetrics", "PluginStats",
]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: str  # counter | gauge | histogram | info
    help: str
    labels: tuple[str, ...] = ()


#: histogram upper bounds 1e-5·2^k s, k = 0..20 (10 µs … 10.5 s), then +Inf
DURATION_BUCKETS_S = tuple(1e-5 * 2 ** k for k in range(21))

#: why records were dropped after they were received (pre-initialised at 0)
DROP_REASONS = ("late", "too_early", "queue_full", "parquet_queue_full", "invalid", "flood",
                "aggregation_error", "window_full", "parquet_write_failed", "clock_range", "shutdown",
                # PEER records (processors/peers.py)
                "peer_late", "peer_invalid", "peer_pairs_full", "peer_queue_full", "peer_clock_range")
#: why a frame / connection was rejected (pre-initialised at 0)
MALFORMED_REASONS = ("bad_magic", "bad_version", "bad_record_size", "too_many_records",
                     "truncated", "no_process", "flood", "internal_error", "process_changed")
#: why a connection was refused or closed by the collector (pre-initialised at 0)
REFUSAL_REASONS = ("connection_limit", "accept_failed", "handshake_timeout", "idle_timeout",
                   "frame_timeout", "buffer_limit", "subscriber_limit", "subscriber_stalled", "auth", "metrics_limit",
                   "metrics_timeout")
#: plugin STATS fields exported as dynamiccl_plugin_records_dropped_total{reason}
PLUGIN_DROP_REASONS = {
    "pool_full": "events_dropped_pool_full",
    "ring_full": "records_dropped_ring_full",
    "undelivered": "records_undelivered",
    "stale": "events_stale",
}

_COLL = ("job_id", "comm", "collective")

METRICS: tuple[MetricSpec, ...] = (
    # --- collector self-metrics -----------------------------------------------------------
    MetricSpec("dynamiccl_collector_records_received_total", "counter",
               "Records received in well-formed frames or pushed in process, all kinds."),
    MetricSpec("dynamiccl_collector_records_decoded_total", "counter",
               "COLL/P2P records decoded and handed to the pipeline."),
    MetricSpec("dynamiccl_collector_records_dropped_total", "counter",
               "Records dropped after receipt, by reason.", ("reason",)),
    MetricSpec("dynamiccl_collector_malformed_frames_total", "counter",
               "Connections dropped because of bad input, by reason.", ("reason",)),
    MetricSpec("dynamiccl_collector_windows_emitted_total", "counter",
               "Closed windows emitted to the exporters."),
    MetricSpec("dynamiccl_collector_records_aggregated_total", "counter",
               "Records that made it into a closed window."),
    MetricSpec("dynamiccl_collector_delivery_gap_records_total", "counter",
               "Records lost between a plugin's ring and the collector (record_seq jumps).",
               ("job_id", "host")),
    MetricSpec("dynamiccl_collector_delivery_gaps_total", "counter",
               "Number of record_seq jumps seen.", ("job_id", "host")),
    MetricSpec("dynamiccl_collector_records_unconfirmed_total", "counter",
               "Records plugins sent on earlier connections to another collector (a restart): stored or lost there."),
    MetricSpec("dynamiccl_collector_clock_steps_total", "counter",
               "Host clock steps corrected: a host's collective finish times moved away from its peers' "
               "(processors/clock_align.py)."),
    MetricSpec("dynamiccl_collector_clock_corrected_records_total", "counter",
               "Records whose times were moved by their host's clock correction."),
    MetricSpec("dynamiccl_collector_durations_refused_total", "counter",
               "Timed records whose duration was negative or over window.max_duration_s: kept as untimed records.",
               ("reason",)),
    MetricSpec("dynamiccl_collector_connections_open", "gauge",
               "Plugin connections currently open."),
    MetricSpec("dynamiccl_plugin_connections_open", "gauge",
               "Plugin connections currently open, per job and host (counted once the connection's PROCESS "
               "record names them).", ("job_id", "host")),
    MetricSpec("dynamiccl_collector_connections_total", "counter",
               "Plugin connections accepted, by transport.", ("transport",)),
    MetricSpec("dynamiccl_collector_connections_refused_total", "counter",
               "Connections refused or closed by the collector (limit, timeouts, credentials), by reason.",
               ("reason",)),
    MetricSpec("dynamiccl_collector_wait_instances_total", "counter",
               "Untimed collective instances by outcome: given wait stand-ins (outcome=instances) or refused "
               "(missing_rank, duplicate, gap, withheld); waits are never exported as latencies.", ("outcome",)),
    MetricSpec("dynamiccl_collector_wait_withheld_lossy_total", "counter",
               "Untimed collective instances withheld (no wait stand-in) because their communicator (or, for "
               "drops not attributed to one, their job) lost records as late or too early while the window was "
               "open, per job (part of outcome=withheld above).", ("job_id",)),
    MetricSpec("dynamiccl_collector_wait_withheld_lossy_scope_total", "counter",
               "The instances of dynamiccl_collector_wait_withheld_lossy_total by the scope the lost records "
               "were attributed to: scope=communicator (only that communicator's waits withheld) or scope=job "
               "(drops of an unknown communicator, or past the communicators tracked).", ("scope",)),
    MetricSpec("dynamiccl_collector_wait_lossy_folded_records_total", "counter",
               "Records dropped as late or too early and counted against their whole job for the waits' lossy "
               "rule because 4096 communicators with drops were tracked already in that window."),
    MetricSpec("dynamiccl_collector_wait_lossy_records_total", "counter",
               "Records lost that fed the waits' lossy-window rule, by cause: late, too_early, window_full "
               "(their communicator, their window); queue_full, flood (their communicator, the windows of their "
               "event times); clock_range (their communicator, every open window); delivery_gap (record_seq "
               "jumps: the whole job, the windows open at the gap); ledger_full (notes past the bound: every "
               "job in every open window).", ("cause",)),
    MetricSpec("dynamiccl_collector_queue_records", "gauge",
               "Records waiting in a bounded queue.", ("queue",)),
    MetricSpec("dynamiccl_collector_parquet_files_written_total", "counter",
               "Parquet part files written."),
    MetricSpec("dynamiccl_collector_parquet_rows_written_total", "counter",
               "Rows written to parquet part files."),
    MetricSpec("dynamiccl_collector_parquet_write_errors_total", "counter",
               "Parquet part files that failed to write (rows lost)."),
    MetricSpec("dynamiccl_collector_parquet_writer_deaths_total", "counter",
               "Times the parquet writer process died or hung and was replaced."),
    MetricSpec("dynamiccl_collector_feature_subscribers", "gauge",
               "Feature-stream subscribers connected (in process and over sockets)."),
    MetricSpec("dynamiccl_collector_feature_windows_dropped_total", "counter",
               "Windows dropped from a slow subscriber's queue (oldest first)."),
    MetricSpec("dynamiccl_collector_series_dropped_total", "counter",
               "Label sets not tracked or evicted because a series budget (max_series, max_window_series) was reached."),
    MetricSpec("dynamiccl_collector_last_window_end_timestamp_seconds", "gauge",
               "Event-time end of the last emitted window."),
    MetricSpec("dynamiccl_build_info", "gauge", "Build information (value 1).", ("version",)),
    # --- plugin STATS ------------------------------------------------------------------------
    MetricSpec("dynamiccl_plugin_records_dropped_total", "counter",
               "Records/events the plugin dropped, summed over its processes, by reason.",
               ("job_id", "host", "reason")),
    MetricSpec("dynamiccl_plugin_records_sent_total", "counter",
               "Records the plugin reports as sent.", ("job_id", "host")),
    MetricSpec("dynamiccl_plugin_reconnects_total", "counter",
               "Plugin reconnects to the collector.", ("job_id", "host")),
    MetricSpec("dynamiccl_plugin_sampled_out_total", "counter",
               "Operations the plugin skipped by sampling.", ("job_id", "host")),
    # --- collectives (cumulative over windows) ----------------------------------------------
    MetricSpec("dynamiccl_collective_duration_seconds", "histogram",
               "Duration of timed collective/P2P operations, per rank record.",
               ("job_id", "host", "comm", "collective", "algo", "proto", "size_bucket")),
    MetricSpec("dynamiccl_collectives_total", "counter",
               "Collective/P2P operations (per-rank records).",
               ("job_id", "comm", "collective", "algo", "proto")),
    MetricSpec("dynamiccl_collective_bytes_total", "counter",
               "Bytes moved by collective/P2P operations (sum of per-rank message bytes).", _COLL),
    # --- last window gauges --------------------------------------------------------------------
    MetricSpec("dynamiccl_bus_bandwidth_bytes_per_second", "gauge",
               "Bus bandwidth in the last window (record-weighted mean of per-key medians).",
               _COLL + ("size_bucket",)),
    MetricSpec("dynamiccl_algorithm_bandwidth_bytes_per_second", "gauge",
               "Algorithm bandwidth in the last window (record-weighted mean of per-key medians).",
               _COLL + ("size_bucket",)),
    MetricSpec("dynamiccl_collective_spread_seconds", "gauge",
               "Max over instances of (max - min) duration across ranks, last window.",
               _COLL + ("size_bucket",)),
    # --- per-peer network timing (PEER records, plugin opt-in; processors/peers.py) -----------
    MetricSpec("dynamiccl_peer_bytes", "gauge",
               "Bytes a rank's proxy moved to (send) or from (recv) one peer, last closed window; the "
               "peers.top_k (comm, rank, peer, direction) rows with the most proxy-state time.",
               ("job_id", "comm", "rank", "peer", "direction")),
    MetricSpec("dynamiccl_peer_state_seconds", "gauge",
               "Proxy-step time in one state (send: gpu_wait, peer_wait, net_wait; recv: net_wait, "
               "flush_wait, gpu_wait) toward one peer, summed over steps and channels, last closed window.",
               ("job_id", "comm", "rank", "peer", "direction", "state")),
    MetricSpec("dynamiccl_collector_peer_records_total", "counter",
               "PEER records that made it into a closed peer window."),
    MetricSpec("dynamiccl_collector_peer_series_dropped_total", "counter",
               "Rows of closed peer windows not exported to Prometheus (beyond peers.top_k; still in parquet)."),
    MetricSpec("dynamiccl_rank_skew_seconds", "gauge",
               "Mean arrival (start) time of this rank minus the instance median, last window.",
               ("job_id", "comm", "rank")),
    MetricSpec("dynamiccl_last_event_timestamp_seconds", "gauge",
               "Event time of the newest operation seen from this rank.", ("job_id", "host", "rank")),
    # --- GPU telemetry (dynamiccl/collector/telemetry/gpu.py, NVML; host = this collector's host) -------
    MetricSpec("dynamiccl_gpu_telemetry_up", "gauge", "1 if NVML is readable on this host, 0 (no driver) otherwise.",
               ("host",)),
    MetricSpec("dynamiccl_gpu_telemetry_errors_total", "counter", "NVML queries that failed.", ("host",)),
    MetricSpec("dynamiccl_gpu_info", "gauge", "GPU identity (value 1).", ("host", "gpu", "uuid", "name")),
    MetricSpec("dynamiccl_gpu_sm_clock_hertz", "gauge", "SM clock.", ("host", "gpu")),
    MetricSpec("dynamiccl_gpu_power_watts", "gauge", "Power draw.", ("host", "gpu")),
    MetricSpec("dynamiccl_gpu_temperature_celsius", "gauge", "GPU temperature.", ("host", "gpu")),
    MetricSpec("dynamiccl_gpu_pcie_throughput_bytes_per_second", "gauge", "PCIe throughput (NVML sample).",
               ("host", "gpu", "direction")),
    MetricSpec("dynamiccl_gpu_nvlink_bytes_total", "counter", "NVLink data bytes, all links.",
               ("host", "gpu", "direction")),
    MetricSpec("dynamiccl_gpu_xid_errors_total", "counter", "XID critical errors.", ("host", "gpu")),
    MetricSpec("dynamiccl_gpu_last_xid", "gauge", "Code of the last XID error (0: none).", ("host", "gpu")),
)

BY_NAME = {m.name: m for m in METRICS}
assert len(BY_NAME) == len(METRICS)


_EVICTED = ("_evicted", "_evicted")
#: job label sets of dynamiccl_collector_wait_withheld_lossy_total (beyond: folded into "_evicted")
MAX_WAIT_JOBS = 1024
#: the causes of records feeding the waits' lossy rule (processors/wait_losses.py), a fixed label set
LOSS_CAUSES = ("late", "too_early", "window_full", "queue_full", "flood", "clock_range", "delivery_gap",
               "ledger_full")


class SelfMetrics:
    """Thread-safe counters of the collector itself (updated per batch, never per record)."""

    def __init__(self, max_gap_label_sets: int = 4096):
        self._lock = threading.Lock()
        self.max_gap_label_sets = max(2, max_gap_label_sets)
        self.received = 0
        self.decoded = 0
        self.aggregated = 0
        self.windows_emitted = 0
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.malformed = dict.fromkeys(MALFORMED_REASONS, 0)
        self.refusals = dict.fromkeys(REFUSAL_REASONS, 0)
        self.gap_records: dict[tuple[str, str], int] = {}
        self.gaps: dict[tuple[str, str], int] = {}
        self.connections_open = 0
        self.connections_total = {"unix": 0, "tcp": 0}
        # (job_id, host) -> open connections; a key leaves at 0, so it holds at most one entry per open
        # connection (bounded by the receiver's max_connections)
        self.job_connections: dict[tuple[str, str], int] = {}
        self.parquet_files = 0
        self.parquet_rows = 0
        self.parquet_errors = 0
        self.parquet_writer_deaths = 0
        self.feature_subscribers = 0
        self.feature_windows_dropped = 0
        self.records_unconfirmed = 0
        self.clock_steps = 0           # host clock steps corrected (processors/clock_align.py)
        self.clock_corrected = 0       # records whose times were moved by a correction
        self.durations_refused = {"negative": 0, "too_long": 0}   # timed records kept as untimed
        self.series_dropped = 0
        self.peer_records = 0          # PEER records in closed peer windows (processors/peers.py)
        self.peer_series_dropped = 0   # peer rows beyond peers.top_k, not exported to Prometheus
        self.last_window_end_s = 0.0
        self.inputs_authenticated = 0  # 1: every network peer had to present a token
        # untimed collective instances by outcome: given wait stand-ins, or refused and why (processors/wait.py)
        self.wait = {"instances": 0, "missing_rank": 0, "duplicate": 0, "gap": 0, "withheld": 0}
        # job_id -> instances withheld because that job lost records (beyond MAX_WAIT_JOBS label sets the
        # oldest is folded into "_evicted": totals exact, labels bounded)
        self.wait_lossy: dict[str, int] = {}
        # the same instances by the scope the drops were attributed to (processors/wait_window.py), and the
        # dropped records counted against their job because MAX_LOSSY_COMMS communicators were tracked already
        self.wait_lossy_scope = {"communicator": 0, "job": 0}
        self.wait_lossy_folded = 0
        # records lost that fed the lossy rule, by cause (processors/wait_losses.py: a fixed label set)
        self.wait_lossy_cause = dict.fromkeys(LOSS_CAUSES, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def drop(self, reason: str, n: int) -> None:
        if n:
            with self._lock:
                self.dropped[reason] = self.dropped.get(reason, 0) + n

    def durations_refused_add(self, negative: int, too_long: int) -> None:
        with self._lock:
            self.durations_refused["negative"] += negative
            self.durations_refused["too_long"] += too_long

    def wait_outcomes(self, counts: dict[str, int]) -> None:
        if any(counts.values()):
            with self._lock:
                for k, v in counts.items():
                    self.wait[k] = self.wait.get(k, 0) + v

    def wait_lossy_jobs(self, counts: dict[str, int]) -> None:
        with self._lock:
            for job, n in counts.items():
                while job not in self.wait_lossy and len(self.wait_lossy) >= MAX_WAIT_JOBS:
                    old = next(k for k in self.wait_lossy if k != "_evicted")
                    self.wait_lossy["_evicted"] = self.wait_lossy.get("_evicted", 0) + self.wait_lossy.pop(old)
                self.wait_lossy[job] = self.wait_lossy.pop(job, 0) + n

    def wait_lossy_scopes(self, counts: dict[str, int]) -> None:
        with self._lock:
            for scope, n in counts.items():
                self.wait_lossy_scope[scope] += n

    def wait_lossy_causes(self, counts: dict[str, int]) -> None:
        with self._lock:
            for cause, n in counts.items():
                self.wait_lossy_cause[cause] += n

    def bad(self, reason: str) -> None:
        with self._lock:
            self.malformed[reason] = self.malformed.get(reason, 0) + 1

    def refused(self, reason: str) -> None:
        with self._lock:
            self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def job_connection(self, key: tuple[str, str], delta: int) -> None:
        """A connection of ``key`` = (job_id, host) opened (+1) or closed (-1)."""
        with self._lock:
            n = self.job_connections.get(key, 0) + delta
            if n > 0:
                self.job_connections[key] = n
            else:
                self.job_connections.pop(key, None)

    def gap(self, job_id: str, host: str, lost: int, jumps: int) -> None:
        """Count a delivery gap per (job, host); beyond ``max_gap_label_sets`` label sets the
        oldest is folded into ("_evicted", "_evicted") so the totals stay exact and bounded."""
        with self._lock:
            key = (job_id, host)
            while key not in self.gaps and len(self.gaps) >= self.max_gap_label_sets:
                old = next(k for k in self.gaps if k != _EVICTED)  # least recently updated
                for table in (self.gap_records, self.gaps):
                    table[_EVICTED] = table.get(_EVICTED, 0) + table.pop(old)
            self.gap_records[key] = self.gap_records.pop(key, 0) + lost  # re-inserted: LRU order
            self.gaps[key] = self.gaps.pop(key, 0) + jumps

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "records_received_total": self.received,
                "records_decoded_total": self.decoded,
                "records_aggregated_total": self.aggregated,
                "windows_emitted_total": self.windows_emitted,
                "records_dropped_total": dict(self.dropped),
                "malformed_frames_total": dict(self.malformed),
                "connections_refused_total": dict(self.refusals),
                "delivery_gap_records_total": sum(self.gap_records.values()),
                "connections_open": self.connections_open,
                "feature_windows_dropped_total": self.feature_windows_dropped,
                "records_unconfirmed_total": self.records_unconfirmed,
                "clock_steps_total": self.clock_steps,
                "clock_corrected_records_total": self.clock_corrected,
                "durations_refused_total": dict(self.durations_refused),
                "inputs_authenticated": self.inputs_authenticated,
                "wait_instances_total": dict(self.wait),
                "wait_withheld_lossy_total": dict(self.wait_lossy),
                "wait_withheld_lossy_scope_total": dict(self.wait_lossy_scope),
                "wait_lossy_folded_records_total": self.wait_lossy_folded,
            }


class PluginStats:
    """Latest STATS values per plugin process; exported summed per (job_id, host).

    Keeping each process's last value (bounded LRU) keeps the sums monotonic across process exits.
    """

    FIELDS = ("events_dropped_pool_full", "records_dropped_ring_full", "records_undelivered",
              "records_sent", "records_emitted", "events_stale", "reconnects", "sampled_out")

    def __init__(self, max_processes: int = 65536):
        self._lock = threading.Lock()
        self._by_process: OrderedDict[tuple, tuple[str, str, dict[str, int]]] = OrderedDict()
        self.max_processes = max_processes

    def update(self, job_id: str, host: str, process_key: tuple, values: dict[str, int]) -> None:
        with self._lock:
            self._by_process[process_key] = (job_id, host, values)
            self._by_process.move_to_end(process_key)
            while len(self._by_process) > self.max_processes:
                self._by_process.popitem(last=False)

    def totals(self, max_label_sets: int = 4096) -> dict[tuple[str, str], dict[str, int]]:
        """Sums per (job_id, host); beyond ``max_label_sets`` the least recently reporting
        processes are summed into ("_evicted", "_evicted")."""
        out: dict[tuple[str, str], dict[str, int]] = {}
        with self._lock:
            for job_id, host, values in reversed(self._by_process.values()):
                key = (job_id, host)
                if key not in out and len(out) >= max_label_sets - 1:
                    key = _EVICTED
                acc = out.setdefault(key, dict.fromkeys(self.FIELDS, 0))
                for k in self.FIELDS:
                    acc[k] += int(values.get(k, 0))
        return out
