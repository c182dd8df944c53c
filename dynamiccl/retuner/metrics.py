"""Every metric the retuner exposes, declared once (names from docs/architecture.md, "Regime changes").

:class:`RetunerMetrics` holds the values and is a prometheus-client ``Collector`` that yields families at
scrape time; counters are pre-initialised at 0 for every label value the code can emit, so the first
push or rollback shows up in ``increase()``.

>>> from prometheus_client import CollectorRegistry
>>> reg = CollectorRegistry(); m = RetunerMetrics(registry=reg)
>>> m.decision("commit"); m.set_dry_run(False)
>>> reg.get_sample_value("dynamiccl_retuner_decisions_total", {"action": "commit"})
1.0
>>> reg.get_sample_value("dynamiccl_retuner_rollbacks_total"), reg.get_sample_value("dynamiccl_retuner_dry_run")
(0.0, 0.0)
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["MetricSpec", "METRICS", "BY_NAME", "ACTIONS", "DROP_REASONS", "PUSH_ERRORS", "RetunerMetrics"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()


#: every decision the audit log and ``decisions_total`` can carry
ACTIONS = ("recommend", "explore", "probe", "commit", "keep", "rollback", "reuse", "revert", "ignore",
           "unapplicable", "abort", "pin")
#: why an input was dropped
DROP_REASONS = ("malformed", "unknown_target", "unattributed", "queue_full", "stale", "not_allowed",
                "unauthenticated",
                "untunable")    # a collective NCCL never asks the tuner about (no tuner token)
#: why a push failed (the plugin keeps the last good file)
PUSH_ERRORS = ("write_failed", "too_many_rules", "invalid_config",
               "bad_target",    # one target's rule could not be built: that target is left out, the rest pushed
               "internal")      # an unexpected error while pushing: the plugin keeps the last good file

#: label names of a target: the collector's, so one matcher selects a communicator in every service
_TARGET = ("comm", "collective", "size_bucket")

METRICS: tuple[MetricSpec, ...] = (
    # --- the contract (docs/architecture.md) ---
    MetricSpec("dynamiccl_retuner_decisions_total", "counter", "Retuner decisions, by action.", ("action",)),
    MetricSpec("dynamiccl_retuner_pushes_total", "counter", "Tuner config versions written."),
    MetricSpec("dynamiccl_retuner_pushes_held_total", "counter",
               "Writes of new rules held back while the newest version was not yet seen applied (one in flight)."),
    MetricSpec("dynamiccl_retuner_rollbacks_total", "counter",
               "Committed configs undone because they measured slower than the one before."),
    MetricSpec("dynamiccl_retuner_active_config_version", "gauge", "Version of the newest tuner config written."),
    MetricSpec("dynamiccl_retuner_active_config_info", "gauge",
               "Configuration the retuner has in force for a target (=1).",
               _TARGET + ("algo", "proto", "channels")),
    MetricSpec("dynamiccl_retuner_measured_gain_ratio", "gauge",
               "Measured mean duration before / after the committed config (>1 = faster).", _TARGET),
    MetricSpec("dynamiccl_retuner_dry_run", "gauge", "1 when the retuner only recommends (writes nothing)."),
    # --- self-metrics ---
    MetricSpec("dynamiccl_retuner_regime_changes_received_total", "counter", "Regime changes received."),
    MetricSpec("dynamiccl_retuner_where_updates_received_total", "counter",
               "Newer where verdicts on reported changes received on the change stream (ignored: no rule uses where)."),
    MetricSpec("dynamiccl_retuner_windows_received_total", "counter", "Feature-stream windows received."),
    MetricSpec("dynamiccl_retuner_observations_received_total", "counter",
               "Per-target duration observations received (window rows or direct)."),
    MetricSpec("dynamiccl_retuner_inputs_dropped_total", "counter", "Inputs dropped, by reason.", ("reason",)),
    MetricSpec("dynamiccl_retuner_push_errors_total", "counter",
               "Tuner config writes that failed (the plugin keeps the last good version), by reason.", ("reason",)),
    MetricSpec("dynamiccl_retuner_audit_errors_total", "counter", "Audit-log lines that could not be written."),
    MetricSpec("dynamiccl_retuner_exploring_targets", "gauge", "Targets currently exploring or verifying."),
    MetricSpec("dynamiccl_retuner_collective_seconds_total", "counter",
               "Collective time observed (sum of durations), the base of the exploration budget."),
    MetricSpec("dynamiccl_retuner_exploration_excess_seconds_total", "counter",
               "Time exploration cost over the incumbent configuration (measured)."),
)
BY_NAME = {m.name: m for m in METRICS}


class RetunerMetrics:
    """Thread-safe values + scrape-time collector. ``registry=None`` keeps it unregistered (tests, evaluation)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._lock = threading.Lock()
        self.decisions = {a: 0 for a in ACTIONS}
        self.dropped = {r: 0 for r in DROP_REASONS}
        self.push_errors = {r: 0 for r in PUSH_ERRORS}
        self.counters = {"pushes": 0, "pushes_held": 0, "rollbacks": 0, "changes": 0, "where_updates": 0, "windows": 0, "observations": 0,
                         "audit_errors": 0, "collective_s": 0.0, "excess_s": 0.0}
        self.version = 0
        self.dry_run = 1
        self.exploring = 0
        self.active: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        self.gain: dict[tuple[str, str, str], float] = {}
        if registry is not None:
            registry.register(self)

    # ---- updates ----
    def decision(self, action: str) -> None:
        with self._lock:
            self.decisions[action] = self.decisions.get(action, 0) + 1

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def push_error(self, reason: str) -> None:
        with self._lock:
            self.push_errors[reason] = self.push_errors.get(reason, 0) + 1

    def inc(self, name: str, v: float = 1) -> None:
        with self._lock:
            self.counters[name] += v

    def set_version(self, v: int) -> None:
        with self._lock:
            self.version = v

    def set_dry_run(self, on: bool) -> None:
        with self._lock:
            self.dry_run = int(bool(on))

    def set_exploring(self, n: int) -> None:
        with self._lock:
            self.exploring = n

    def set_active(self, target: tuple[str, str, str], cfg: tuple[str, str, str] | None) -> None:
        with self._lock:
            if cfg is None:
                self.active.pop(target, None)
            else:
                self.active[target] = cfg

    def set_gain(self, target: tuple[str, str, str], ratio: float | None) -> None:
        with self._lock:
            if ratio is None:
                self.gain.pop(target, None)
            else:
                self.gain[target] = ratio

    # ---- scrape ----
    def collect(self):
        with self._lock:
            c = dict(self.counters)
            dec, drop, perr = dict(self.decisions), dict(self.dropped), dict(self.push_errors)
            active, gain = dict(self.active), dict(self.gain)
            version, dry, exploring = self.version, self.dry_run, self.exploring

        def fam(name: str):
            s = BY_NAME[name]
            cls = CounterMetricFamily if s.type == "counter" else GaugeMetricFamily
            return cls(name, s.help, labels=list(s.labels)) if s.labels else cls(name, s.help)

        f = fam("dynamiccl_retuner_decisions_total")
        for a, v in dec.items():
            f.add_metric([a], float(v))
        yield f
        for name, key in (("dynamiccl_retuner_pushes_total", "pushes"), ("dynamiccl_retuner_rollbacks_total", "rollbacks"),
                          ("dynamiccl_retuner_pushes_held_total", "pushes_held"),
                          ("dynamiccl_retuner_regime_changes_received_total", "changes"),
                          ("dynamiccl_retuner_where_updates_received_total", "where_updates"),
                          ("dynamiccl_retuner_windows_received_total", "windows"),
                          ("dynamiccl_retuner_observations_received_total", "observations"),
                          ("dynamiccl_retuner_audit_errors_total", "audit_errors"),
                          ("dynamiccl_retuner_collective_seconds_total", "collective_s"),
                          ("dynamiccl_retuner_exploration_excess_seconds_total", "excess_s")):
            f = fam(name)
            f.add_metric([], float(c[key]))
            yield f
        for name, table in (("dynamiccl_retuner_inputs_dropped_total", drop),
                            ("dynamiccl_retuner_push_errors_total", perr)):
            f = fam(name)
            for r, v in table.items():
                f.add_metric([r], float(v))
            yield f
        for name, v in (("dynamiccl_retuner_active_config_version", version), ("dynamiccl_retuner_dry_run", dry),
                        ("dynamiccl_retuner_exploring_targets", exploring)):
            f = fam(name)
            f.add_metric([], float(v))
            yield f
        f = fam("dynamiccl_retuner_active_config_info")
        for t, cfg in sorted(active.items()):
            f.add_metric(list(t) + list(cfg), 1.0)
        yield f
        f = fam("dynamiccl_retuner_measured_gain_ratio")
        for t, v in sorted(gain.items()):
            f.add_metric(list(t), v)
        yield f
