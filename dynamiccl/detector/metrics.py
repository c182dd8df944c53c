"""Every metric the detector exposes, declared once (docs/architecture.md "Regime changes").

Dashboards and alert rules are checked against :data:`METRICS`. Conventions as the collector's:
``dynamiccl_`` prefix, base units, ``_total`` on counters. :class:`DetectorMetrics` registers
them on a ``prometheus_client`` registry (a private one by default, so several detectors can
live in one process).

Label names are the collector's (``job_id``, ``comm``, ``collective``, ``size_bucket``), so one
PromQL matcher selects a communicator in every service. Label sets are bounded: ``regime_active``
is 1 per (job, kind, communicator, where) while a change is active and 0 after its recovery (the
newest :data:`RECOVERED_KEPT` recovered sets are kept, older ones removed); ``regime_magnitude``
exists only while active; ``cusum_statistic`` keeps only the ``top_statistics`` largest streams per
job (the others are removed); ``autoencoder_score`` one per job.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector,
                               disable_created_metrics)

__all__ = ["MetricSpec", "METRICS", "BY_NAME", "DROP_REASONS", "INVALID_REASONS", "DetectorMetrics",
           "ActiveRegimes", "REGIME_LABELS", "RECOVERED_KEPT", "MAX_COMMS_PER_CHANGE",
           "export_process_metrics"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()


#: why a whole window was not processed (pre-initialised at 0)
DROP_REASONS = ("malformed", "out_of_order", "error")
#: why a stream's value in a window was skipped (pre-initialised at 0)
INVALID_REASONS = ("nan", "nonpositive", "absurd", "sparse", "stream_limit")
#: detection delay buckets (s): 0.25 s … 64 s
DELAY_BUCKETS_S = tuple(0.25 * 2 ** k for k in range(9))
#: labels of regime_active / regime_magnitude: one series per communicator a change touches
REGIME_LABELS = ("job_id", "kind", "comm", "where")
#: recovered regime_active series (value 0) kept so dashboards show the end; older ones are removed
RECOVERED_KEPT = 256
#: communicators of one change that get their own regime series (a change rarely spans more)
MAX_COMMS_PER_CHANGE = 32

METRICS: tuple[MetricSpec, ...] = (
    # --- the contract (docs/architecture.md) ------------------------------------------------
    MetricSpec("dynamiccl_detector_windows_received_total", "counter",
               "Feature-stream windows received (in process or from the collector's stream)."),
    MetricSpec("dynamiccl_detector_windows_dropped_total", "counter",
               "Windows not processed, by reason.", ("reason",)),
    MetricSpec("dynamiccl_detector_regime_changes_total", "counter",
               "Regime changes emitted, by kind.", ("kind",)),
    MetricSpec("dynamiccl_detector_regime_active", "gauge",
               "1 while a regime change is active on this communicator, 0 after it recovered.", REGIME_LABELS),
    MetricSpec("dynamiccl_detector_regime_magnitude", "gauge",
               "Magnitude of an active regime change (new/old latency ratio); removed on recovery.",
               REGIME_LABELS),
    MetricSpec("dynamiccl_detector_cusum_statistic", "gauge",
               "max(S+, S-)/threshold of a stream's CUSUM (>= 1 fires); the largest streams per job.",
               ("job_id", "comm", "collective", "size_bucket")),
    MetricSpec("dynamiccl_detector_autoencoder_score", "gauge",
               "Autoencoder reconstruction error of the job's last window.", ("job_id",)),
    MetricSpec("dynamiccl_detector_detection_delay_seconds", "histogram",
               "Event-time delay from a change's estimated onset to its detection."),
    # --- self-observation ------------------------------------------------------------------
    MetricSpec("dynamiccl_detector_changes_emitted_total", "counter",
               "Regime changes handed to the outputs (stream server, log, Grafana)."),
    MetricSpec("dynamiccl_detector_where_updates_emitted_total", "counter",
               "Newer where verdicts on reported changes sent to the outputs (stream server, changes file, log)."),
    MetricSpec("dynamiccl_detector_transient_ends_emitted_total", "counter",
               "Transient excursions whose end was sent to the stream's subscribers (the retuner) as a recovery "
               "with evidence.transient; not regime changes."),
    MetricSpec("dynamiccl_detector_changes_dropped_total", "counter",
               "Regime changes dropped on the way out, by reason (subscriber queue full, ...).",
               ("reason",)),
    MetricSpec("dynamiccl_detector_values_invalid_total", "counter",
               "Per-stream window values skipped as invalid, by reason.", ("reason",)),
    MetricSpec("dynamiccl_detector_streams", "gauge", "Streams currently tracked."),
    MetricSpec("dynamiccl_detector_streams_rebaselined_total", "counter",
               "Streams re-baselined after a benign workload or configuration change."),
    MetricSpec("dynamiccl_detector_rank_set_kept_total", "counter",
               "Streams whose reporting ranks changed (a rank's records stopped or came back, a host's clock "
               "stepped) with the latency where it was: baseline kept, no new warm-up."),
    MetricSpec("dynamiccl_detector_changes_localised_total", "counter",
               "Degradations whose ranks' offsets named a rank (late arrival) or a link (late finish).",
               ("kind",)),
    MetricSpec("dynamiccl_detector_alarms_suppressed_total", "counter",
               "Stream alarms that did not become a change, by reason.", ("reason",)),
    MetricSpec("dynamiccl_detector_window_processing_seconds", "histogram",
               "Wall time to process one window."),
    MetricSpec("dynamiccl_detector_feature_stream_up", "gauge",
               "1 while connected to the collector's feature stream."),
    MetricSpec("dynamiccl_detector_feature_stream_reconnects_total", "counter",
               "Reconnections to the collector's feature stream."),
    MetricSpec("dynamiccl_detector_subscribers", "gauge", "Clients of the regime-change stream."),
    MetricSpec("dynamiccl_detector_grafana_annotations_total", "counter",
               "Grafana annotations posted, by result (ok, error).", ("result",)),
)
BY_NAME = {m.name: m for m in METRICS}

SUPPRESS_REASONS = ("spikes_suppressed", "small_shifts", "alarms_absorbed", "alarms_merged",
                    "incidents_dropped", "pending_dropped", "workload_changes",
                    "transients", "softer_releases", "improvements_adopted", "incidents_dissolved")


def _base(name: str) -> str:
    return name[:-len("_total")] if name.endswith("_total") else name


class DetectorMetrics:
    """The detector's prometheus_client objects, on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        made = {}
        for m in METRICS:
            if m.type == "counter":
                made[m.name] = Counter(_base(m.name), m.help, m.labels, registry=self.registry)
            elif m.type == "gauge":
                made[m.name] = Gauge(m.name, m.help, m.labels, registry=self.registry)
            else:
                buckets = DELAY_BUCKETS_S if "delay" in m.name else (
                    1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0)
                made[m.name] = Histogram(m.name, m.help, m.labels, buckets=buckets, registry=self.registry)
        self.by_name = made
        p = "dynamiccl_detector_"
        self.windows_received = made[p + "windows_received_total"]
        self.windows_dropped = made[p + "windows_dropped_total"]
        self.regime_changes = made[p + "regime_changes_total"]
        self.regime_active = made[p + "regime_active"]
        self.regime_magnitude = made[p + "regime_magnitude"]
        self.cusum_statistic = made[p + "cusum_statistic"]
        self.autoencoder_score = made[p + "autoencoder_score"]
        self.detection_delay = made[p + "detection_delay_seconds"]
        self.changes_emitted = made[p + "changes_emitted_total"]
        self.changes_dropped = made[p + "changes_dropped_total"]
        self.transient_ends_emitted = made[p + "transient_ends_emitted_total"]
        self.where_updates_emitted = made[p + "where_updates_emitted_total"]
        self.values_invalid = made[p + "values_invalid_total"]
        self.streams = made[p + "streams"]
        self.rebaselined = made[p + "streams_rebaselined_total"]
        self.rank_set_kept = made[p + "rank_set_kept_total"]
        self.suppressed = made[p + "alarms_suppressed_total"]
        self.localised = made[p + "changes_localised_total"]
        self.processing = made[p + "window_processing_seconds"]
        self.feature_up = made[p + "feature_stream_up"]
        self.reconnects = made[p + "feature_stream_reconnects_total"]
        self.subscribers = made[p + "subscribers"]
        self.grafana = made[p + "grafana_annotations_total"]
        from .events import KINDS
        for k in KINDS:
            self.regime_changes.labels(kind=k)
        for r in DROP_REASONS:
            self.windows_dropped.labels(reason=r)
        for r in INVALID_REASONS:
            self.values_invalid.labels(reason=r)
        for r in SUPPRESS_REASONS:
            self.suppressed.labels(reason=r)
        for r in ("ok", "error"):
            self.grafana.labels(result=r)
        self.changes_dropped.labels(reason="queue_full")

    def value(self, name: str, **labels) -> float:
        """Current value of a counter/gauge sample (tests, evaluation)."""
        v = self.registry.get_sample_value(name, labels or None)
        return 0.0 if v is None else float(v)


class ActiveRegimes:
    """``regime_active`` (0/1) and ``regime_magnitude`` per (job_id, kind, comm, where).

    Several active changes may share one label set (two changes of one kind on one communicator):
    the set stays at 1 until the last of them recovers, and shows the newest magnitude.
    """

    def __init__(self, active, magnitude, keep_recovered: int = RECOVERED_KEPT):
        self._active, self._magnitude = active, magnitude
        self._holders: dict[tuple, set[str]] = {}          # label set -> ids of active changes
        self._by_change: dict[str, list[tuple]] = {}
        self._recovered: OrderedDict[tuple, None] = OrderedDict()
        self._keep = keep_recovered

    def start(self, change_id: str, label_sets: list[tuple], magnitude: float) -> None:
        self._by_change[change_id] = label_sets
        for labels in label_sets:
            self._holders.setdefault(labels, set()).add(change_id)
            self._recovered.pop(labels, None)
            self._active.labels(*labels).set(1)
            self._magnitude.labels(*labels).set(magnitude)

    def end(self, change_id: str) -> None:
        for labels in self._by_change.pop(change_id, []):
            holders = self._holders.get(labels, set())
            holders.discard(change_id)
            if holders:
                continue
            self._holders.pop(labels, None)
            self._active.labels(*labels).set(0)
            _remove(self._magnitude, labels)
            self._recovered[labels] = None
            while len(self._recovered) > self._keep:
                old, _ = self._recovered.popitem(last=False)
                _remove(self._active, old)


def _remove(gauge, labels: tuple) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass


def export_process_metrics(registry: CollectorRegistry) -> None:
    """Ready a registry for serving: ``process_*`` metrics (CPU, resident memory, open fds, start time)
    and no ``_created`` series (one per counter/histogram child, read by no rule or dashboard).

    ``disable_created_metrics`` is process-wide; a registry that already has process metrics keeps them.
    """
    disable_created_metrics()
    try:
        ProcessCollector(registry=registry)
    except ValueError:   # "Duplicated timeseries": the registry already exports process_*
        pass
