"""Typed, validated configuration of the detector service (`dynamiccl.detector.service.Detector`).

``DetectorConfig()`` holds the defaults; ``validate()`` raises ``ValueError`` naming the field.
Runtime objects (clock, registry) are keyword arguments of the classes, never config fields.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ._baseline import BASELINE_METHODS

__all__ = ["DetectorConfig", "DEFAULT_FEATURES", "DEFAULT_METRICS", "DEFAULT_SERVE"]

DEFAULT_FEATURES = "tcp:127.0.0.1:9465"
DEFAULT_METRICS = "127.0.0.1:9466"
DEFAULT_SERVE = "tcp:127.0.0.1:9467"


@dataclass(frozen=True)
class DetectorConfig:
    """Detector settings. Times are seconds of event time; counts are windows.

    Streams are (job_id, comm_hash, func, size_bucket) rows of the collector's ``keys`` frame;
    each feeds ``log(lat_p50_s)`` per window to two CUSUM banks (``deltas``) that share
    ``arl0`` (per stream, per bank) and ``warmup``.
    """

    # --- per-stream CUSUM -----------------------------------------------------------------
    deltas: tuple[float, ...] = (2.0, 6.0)   # one CUSUMBank per delta (shift sizes in sigma)
    arl0: float = 1e5                        # minimum windows between false alarms, per stream and bank
    stream_false_alarms_per_day: float = 1.0  # all streams together (before fusion): per-stream arl0 =
                                             # max(arl0, streams x windows per day / this)
    warmup: int = 60                         # windows of robust baseline before a stream is monitored
    self_start: bool = False                 # self-starting baselines (`dynamiccl.detector.self_start`): the
                                             # known-baseline threshold from the first monitored
                                             # window, the baseline learning on; for a short warm-up
                                             # (warmup=5). Off: thresholds calibrated for
                                             # max(warmup, 60) samples of a fixed baseline (the
                                             # simulated suite's recall fell 0.954 -> 0.884 with it
                                             # on: see docs/evaluation/2026-11-26-detection-real-jobs.md)
    baseline_estimator: str = "winsorized"   # "winsorized" (mean/sd of the warm-up clipped at
                                             # median +- 3 MAD-sigma: h = 2.2 instead of 4.1 for
                                             # delta = 6 at 60 windows) or "mad" (median / 1.4826
                                             # MAD: a noisier scale, a higher threshold)
    instance_weight: float = 0.5             # a window holding fewer than this x its stream's
                                             # typical instances (a noisier median, often a phase's
                                             # edge) enters the CUSUM shrunk by sqrt(instances /
                                             # (this x typical)); 0: off
    long_run_variance: float = 2.0           # per-window noise's long-run variance / variance (1 +
                                             # 2 x sum of autocorrelations; 1.0-2.8 measured on the
                                             # suite's streams): the threshold of a chart that
                                             # integrates over many windows (delta = 2) is set for it
                                             # (`dynamiccl.detector.arl.cusum_threshold_correlated`); 1: off
    baseline_memory: int = 480               # a monitored baseline keeps learning from its in-control
                                             # windows: expanding up to this many, then forgetting
                                             # with this horizon
    scale_floor: float = 0.004               # minimum baseline sigma of log-latency (0.4 %)
    min_instances: int = 2                   # a stream's window needs this many instances
    max_latency_s: float = 3600.0            # lat_p50 above this (or <= 0, NaN) is invalid
    max_streams: int = 2_000_000             # streams beyond are dropped (counted)
    stream_idle_s: float = 3600.0            # streams unseen this long are forgotten
    # --- fusion ---------------------------------------------------------------------------
    corroborate: int = 2                     # streams alarming together that need no confirmation
    confirm_z: float = 3.0                   # a lone alarm is confirmed if the next window is >= this (old sigma)
    persist_ratio: float = 1.5               # smaller shifts must last two windows (hiccups last one)
    confirm_windows: int = 2                 # windows a lone/small alarm may take to confirm
    quiet_z: float = 1.0                     # multi-node alarms need no confirmation while the job's
                                             # intra-node streams stay below this (median z); 0: off
    merge_s: float = 5.0                     # alarms this soon after an incident's detection join it
    merge_similar_s: float = 30.0            # ... or this soon after its onset with a similar shift
    min_ratio: float = 1.03                  # latency ratio below this is not a regime change
    small_shift_wait: bool = False           # ... judged on the next windows when first seen in
                                             # the alarm window (confirmed or old baseline restored;
                                             # off: 2 false changes on eval-mixed, see README)
    step_ratio: float = 1.1                  # an incident's level moving again by this (deeper or
                                             # softer) is a change of its own (`dynamiccl.detector.steps`)
    recovery_fraction: float = 0.3           # back within this fraction of the shift = recovered
    recovery_windows: int = 2                # ... for this many consecutive windows
    flap_transitions: int = 2                # off->on transitions that make an incident "flapping"
    flap_window_s: float = 10.0              # ... within this span (also: re-onset after a recovery);
                                             # a flapping incident recovers after half of it quiet.
                                             # Longer spans called separate regimes 10-30 s apart
                                             # (a throttle, its release, the next throttle) one
                                             # flapping change whose release came 15 s late
                                             # (docs/evaluation/2026-11-27-detection.md)
    workload_change: float = 0.08            # |log| change of bytes per record that marks a new mix
    coverage_change: float = 0.04            # |log| change of ranks reporting per instance
    workload_settle: int = 5                 # windows after a job's workload change whose alarms are part of it
    workload_settle_ratio: float = 1.15      # ... when they shift latency by less than this
    workload_settle_share: float = 0.02      # ... and the changed streams took this share of the
                                             # job's collective time (instances x latency)
    workload_settle_chain: bool = False      # a side-effect alarm extends the settling time (the old
                                             # behaviour: one mix could blind the whole job in turn)
    partial_window: float = 0.3              # fewer instances than this x typical: window is partial
    history: int = 32                        # windows of per-stream history kept for estimates
    # --- straggler ------------------------------------------------------------------------
    straggler_share: float = 0.6             # share of complete instances a rank is strictly shortest in
    straggler_min_instances: int = 3
    straggler_recheck: bool = True           # a straggler named from its onset's window alone, on
                                             # < 2 x straggler_min_instances instances or on
                                             # collectives >= 2 % of a window long, is named one
                                             # window later, on both windows
    onset_wait: bool = True                  # a change whose alarms come from a window holding its
                                             # onset part-way through (both regimes mixed: p90/p50
                                             # spread widened more than the p50 moved) is judged one
                                             # window later: kind, ranks and magnitude
    straggler_trigger_z: float = 8.0         # rank evidence alone opens a straggler change at this
                                             # binomial z over two windows (0: off)
    # --- autoencoder ----------------------------------------------------------------------
    autoencoder: bool = True                 # per-job torch autoencoder over window features
    autoencoder_grace: int = 60              # windows learned before its score counts
    seed: int = 0
    # --- outputs --------------------------------------------------------------------------
    top_statistics: int = 50                 # cusum_statistic series exported per job (largest)

    def validate(self) -> "DetectorConfig":
        for f in dataclasses.fields(self):
            if isinstance(f.default, bool) and not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"detector config: {f.name} must be true or false, got {getattr(self, f.name)!r}")
        def positive(name, integer=False):
            v = getattr(self, name)
            ok = isinstance(v, int) and not isinstance(v, bool) if integer else (
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            if not ok or v <= 0:
                kind = "an int" if integer else "a finite number"
                raise ValueError(f"detector config: {name} must be {kind} > 0, got {v!r}")

        def within(name, lo, hi=math.inf):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi):
                bound = f">= {lo}" if hi == math.inf else f"in [{lo}, {hi}]"
                raise ValueError(f"detector config: {name} must be a finite number {bound}, got {v!r}")

        if not self.deltas or not all(isinstance(d, (int, float)) and d > 0 for d in self.deltas):
            raise ValueError(f"detector config: deltas must be a non-empty tuple of numbers > 0, got {self.deltas!r}")
        if not self.arl0 > 1:
            raise ValueError(f"detector config: arl0 must be > 1, got {self.arl0!r}")
        within("straggler_trigger_z", 0)
        within("quiet_z", 0)
        within("long_run_variance", 1)
        within("instance_weight", 0, 1)
        for name in ("stream_false_alarms_per_day", "scale_floor", "max_latency_s", "stream_idle_s", "confirm_z", "merge_s", "merge_similar_s",
                     "flap_window_s", "workload_change", "coverage_change", "workload_settle_share", "partial_window", "straggler_share"):
            positive(name)
        if self.baseline_estimator not in BASELINE_METHODS:
            raise ValueError(f"detector config: baseline_estimator must be one of {BASELINE_METHODS}, "
                             f"got {self.baseline_estimator!r}")
        for name in ("baseline_memory", "confirm_windows", "workload_settle", "warmup", "min_instances", "max_streams", "corroborate", "recovery_windows",
                     "flap_transitions", "history", "straggler_min_instances", "autoencoder_grace",
                     "top_statistics"):
            positive(name, integer=True)
        if self.warmup < 2:
            raise ValueError(f"detector config: warmup must be >= 2, got {self.warmup!r}")
        if self.baseline_memory < self.warmup:
            raise ValueError(f"detector config: baseline_memory must be >= warmup, got {self.baseline_memory!r}")
        if not 0 < self.recovery_fraction < 1:
            raise ValueError(f"detector config: recovery_fraction must be in (0, 1), got {self.recovery_fraction!r}")
        if not self.persist_ratio >= 1:
            raise ValueError(f"detector config: persist_ratio must be >= 1, got {self.persist_ratio!r}")
        if not self.workload_settle_ratio >= 1:
            raise ValueError(f"detector config: workload_settle_ratio must be >= 1, got {self.workload_settle_ratio!r}")
        if not self.step_ratio > 1:
            raise ValueError(f"detector config: step_ratio must be > 1, got {self.step_ratio!r}")
        if not self.min_ratio >= 1:
            raise ValueError(f"detector config: min_ratio must be >= 1, got {self.min_ratio!r}")
        if not 0.5 <= self.straggler_share <= 1:
            raise ValueError(f"detector config: straggler_share must be in [0.5, 1], got {self.straggler_share!r}")
        return self

    def replace(self, **changes) -> "DetectorConfig":
        return dataclasses.replace(self, **changes).validate()
