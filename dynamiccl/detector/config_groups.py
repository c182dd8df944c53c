"""The groups of `dynamiccl.detector.config.DetectorConfig`, one frozen dataclass per concern.

Each group's ``validate()`` raises ``ValueError`` naming the dotted field (``baseline.warmup``).
Times are seconds of event time; counts are windows. The rule behind each default is in the
comment next to it; measurements that chose them are in docs/evaluation/.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from ._baseline import BASELINE_METHODS

__all__ = ["CusumConfig", "BaselineConfig", "StreamsConfig", "FusionConfig", "IncidentConfig", "WorkloadConfig",
           "StragglerConfig", "AutoencoderConfig", "OutputConfig", "GROUPS"]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class _Group:
    """Checks shared by the groups; ``KEY`` is the group's name in dotted keys."""

    KEY: ClassVar[str]

    def _fail(self, name: str, rule: str) -> None:
        raise ValueError(f"detector config: {self.KEY}.{name} must be {rule}, got {getattr(self, name)!r}")

    def _switches(self) -> None:
        # "yes" or 1 from a YAML/--set typo is not silently truthy
        for f in dataclasses.fields(self):
            if isinstance(f.default, bool) and not isinstance(getattr(self, f.name), bool):
                self._fail(f.name, "true or false")

    def _positive(self, *names: str, integer: bool = False) -> None:
        for name in names:
            v = getattr(self, name)
            ok = (isinstance(v, int) and not isinstance(v, bool)) if integer else _number(v)
            if not ok or v <= 0:
                self._fail(name, "an int > 0" if integer else "a finite number > 0")

    def _within(self, name: str, lo: float, hi: float = math.inf, *, open_lo: bool = False,
                open_hi: bool = False) -> None:
        v = getattr(self, name)
        ok = _number(v) and (v > lo if open_lo else v >= lo) and (v < hi if open_hi else v <= hi)
        if not ok:
            if hi == math.inf:
                self._fail(name, f"a finite number {'>' if open_lo else '>='} {lo}")
            self._fail(name, f"a finite number in {'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}")


@dataclass(frozen=True)
class CusumConfig(_Group):
    """Per-stream CUSUM banks: each stream feeds ``log(lat_p50_s)`` per window to one bank per delta."""

    KEY: ClassVar[str] = "cusum"
    deltas: tuple[float, ...] = (2.0, 6.0)   # one CUSUMBank per delta (shift sizes in sigma)
    arl0: float = 1e5                        # minimum windows between false alarms, per stream and bank
    stream_false_alarms_per_day: float = 1.0  # all streams together (before fusion): per-stream arl0 =
                                             # max(arl0, streams x windows per day / this)
    long_run_variance: float = 2.0           # per-window noise's long-run variance / variance (1 +
                                             # 2 x sum of autocorrelations; 1.0-2.8 measured on the
                                             # suite's streams): the threshold of a chart that
                                             # integrates over many windows (delta = 2) is set for it
                                             # (`dynamiccl.detector.arl.cusum_threshold_correlated`); 1: off

    def validate(self) -> "CusumConfig":
        if not isinstance(self.deltas, tuple) or not self.deltas or not all(
                _number(d) and d > 0 for d in self.deltas):
            self._fail("deltas", "a non-empty tuple of numbers > 0")
        self._within("arl0", 1, open_lo=True)
        self._positive("stream_false_alarms_per_day")
        self._within("long_run_variance", 1)
        return self


@dataclass(frozen=True)
class BaselineConfig(_Group):
    """Each stream's baseline (level and scale of its log-latency) before and while it is monitored."""

    KEY: ClassVar[str] = "baseline"
    warmup: int = 60                         # windows of robust baseline before a stream is monitored
    self_start: bool = False                 # self-starting baselines (`dynamiccl.detector.self_start`): the
                                             # known-baseline threshold from the first monitored
                                             # window, the baseline learning on; for a short warm-up
                                             # (warmup=5). Off: thresholds calibrated for
                                             # max(warmup, 60) samples of a fixed baseline (the
                                             # simulated suite's recall fell 0.954 -> 0.884 with it
                                             # on: see docs/evaluation/2026-11-26-detection-real-jobs.md)
    self_start_until: int = 60               # with ``self_start``: a baseline that has learnt this many
                                             # windows stops learning and is judged from then on
                                             # against the fixed-baseline threshold for that many
                                             # samples (the long-run chart of ``self_start=False``);
                                             # 0: it learns for ever
    estimator: str = "winsorized"            # "winsorized" (mean/sd of the warm-up clipped at
                                             # median +- 3 MAD-sigma: h = 2.2 instead of 4.1 for
                                             # delta = 6 at 60 windows) or "mad" (median / 1.4826
                                             # MAD: a noisier scale, a higher threshold)
    instance_weight: float = 0.5             # a window holding fewer than this x its stream's
                                             # typical instances (a noisier median, often a phase's
                                             # edge) enters the CUSUM shrunk by sqrt(instances /
                                             # (this x typical)); 0: off
    split_warmup: bool = False               # a full warm-up holding a level shift (Pettitt's rank test,
                                             # p < 1e-3, >= ``incidents.step_ratio``) warms up again
                                             # from the later regime (`dynamiccl.detector.warmup_split`)
    trim_warmup: bool = False                # at a recovery, the incident's communicators' streams still
                                             # warming up forget their samples since its onset
                                             # (`dynamiccl.detector.warmup_trim`); off: dev half
                                             # +1 within 5 s, +2 false alarms (seed 16)
    diff_scale: bool = False                 # a full warm-up's scale is the smaller of the estimator's and
                                             # the largest lag-1..5 difference scale: robust to a
                                             # level shift inside it (`dynamiccl.detector.warmup_scale`)
    memory: int = 480                        # a monitored baseline keeps learning from its in-control
                                             # windows: expanding up to this many, then forgetting
                                             # with this horizon
    scale_floor: float = 0.004               # minimum baseline sigma of log-latency (0.4 %)
    early_ratio: float = 1.5                 # during a stream's first warm-up, two successive values
                                             # this x (or 1 / this x) its warm-up median and
                                             # ``early_z`` robust sigma away are a change
                                             # (`dynamiccl.detector.early`); 0: off
    early_z: float = 5.0                     # ... and this many MAD-sigma of its warm-up samples
    early_min: int = 10                      # ... with this many warm-up samples behind the median
    paced_two_step: bool = True              # a step-paced stream's two successive samples >= confirm_z
                                             # and >= early_ratio x away, each backed by its job's step,
                                             # alarm (`dynamiccl.detector.paced_two_step`)
    paced_warmup: bool = True                # a step-paced job's streams in their first warm-up are also
                                             # judged by the short-baseline warm-up CUSUMs from
                                             # ``early_min`` samples (`dynamiccl.detector.paced_warmup`)
    warmup_step: bool = True                 # a pooled stream's first warm-up buffer is tested
                                             # for one step (early_ratio and early_z bars, >= 3 samples a
                                             # side) from ``early_min`` samples (`dynamiccl.detector.warmup_step`)
    resume_warmup: bool = True               # a warming stream re-baselined for a new workload stashes its
                                             # warm-up; a return to that workload resumes it
                                             # (`dynamiccl.detector.warmup_stash`)
    chart_excursions: bool = False           # each warm-up CUSUM chart (delta) keeps its own excursion's
                                             # reference, not the oldest open one's
                                             # (`dynamiccl.detector.chart_excursions`); off: dev
                                             # half within 5 s 0.720 -> 0.668 (step-paced seeds)

    def validate(self) -> "BaselineConfig":
        self._switches()
        self._positive("warmup", "memory", integer=True)
        if self.warmup < 2:
            self._fail("warmup", ">= 2")
        if self.memory < self.warmup:
            self._fail("memory", f">= {self.KEY}.warmup ({self.warmup})")
        if not (isinstance(self.self_start_until, int) and not isinstance(self.self_start_until, bool)
                and (self.self_start_until == 0 or self.self_start_until >= self.warmup)):
            self._fail("self_start_until", f"0 or an int >= {self.KEY}.warmup ({self.warmup})")
        if self.estimator not in BASELINE_METHODS:
            self._fail("estimator", f"one of {BASELINE_METHODS}")
        self._within("instance_weight", 0, 1)
        self._positive("scale_floor")
        if not (_number(self.early_ratio) and (self.early_ratio == 0 or self.early_ratio > 1)):
            self._fail("early_ratio", "0 (off) or a finite number > 1")
        self._positive("early_z")
        self._positive("early_min", integer=True)
        if self.early_min < 3:
            self._fail("early_min", "an int >= 3")
        return self


@dataclass(frozen=True)
class StreamsConfig(_Group):
    """Which (job_id, comm_hash, func, size_bucket) windows count, and how many streams are kept."""

    KEY: ClassVar[str] = "streams"
    min_instances: int = 2                   # a stream's window needs this many instances
    max_latency_s: float = 3600.0            # lat_p50 above this (or <= 0, NaN) is invalid
    max_streams: int = 2_000_000             # streams beyond are dropped (counted)
    idle_s: float = 3600.0                   # streams unseen this long are forgotten
    history: int = 32                        # windows of per-stream history kept for estimates
    step_rate: bool = False                  # a step-rate stream per communicator (seconds per
                                             # instance of a window whose window before had data;
                                             # `dynamiccl.detector.step_rate`): a slower step whose
                                             # collectives' latencies hide it in their noise. Off:
                                             # on the test bed's dev half +1 change for +1 false
                                             # alarm (docs/evaluation/2026-11-27-detection.md)

    def validate(self) -> "StreamsConfig":
        self._positive("min_instances", "max_streams", "history", integer=True)
        self._positive("max_latency_s", "idle_s")
        return self


@dataclass(frozen=True)
class FusionConfig(_Group):
    """When the streams' alarms become a change: corroboration, confirmation, minimum size."""

    KEY: ClassVar[str] = "fusion"
    corroborate: int = 2                     # streams alarming together that need no confirmation
    confirm_z: float = 3.0                   # a lone alarm is confirmed if the next window is >= this (old sigma)
    persist_ratio: float = 1.5               # smaller shifts must last two windows (hiccups last one)
    confirm_windows: int = 2                 # windows a lone/small alarm may take to confirm
    quiet_z: float = 1.0                     # multi-node alarms need no confirmation while the job's
                                             # intra-node streams stay below this (median z); 0: off
    min_ratio: float = 1.03                  # latency ratio below this is not a regime change
    small_shift_wait: bool = False           # ... judged on the next windows when first seen in
                                             # the alarm window (confirmed or old baseline restored;
                                             # off: 2 false changes on eval-mixed, see README)
    partial_window: float = 0.3              # fewer instances than this x typical: window is partial
    onset_wait: bool = True                  # a change whose alarms come from a window holding its
                                             # onset part-way through (both regimes mixed: p90/p50
                                             # spread widened more than the p50 moved) is judged one
                                             # window later: kind, ranks and magnitude
    onset_level: bool = False                # an unconfirmed alarm whose streams' median since its
                                             # CUSUM onset is < confirm_z waits for confirmation
                                             # (`dynamiccl.detector.onset_level`)
    preconfirm: bool = False                 # an alarm whose window and the one before are both
                                             # >= confirm_z is confirmed at once (`preconfirm.py`)

    def validate(self) -> "FusionConfig":
        self._switches()
        self._positive("corroborate", "confirm_windows", integer=True)
        self._positive("confirm_z", "partial_window")
        self._within("persist_ratio", 1)
        self._within("quiet_z", 0)
        self._within("min_ratio", 1)
        return self


@dataclass(frozen=True)
class IncidentConfig(_Group):
    """An open change (incident): what joins it, when it steps, recovers or flaps."""

    KEY: ClassVar[str] = "incidents"
    # ``merge_s``, ``merge_similar_s`` and ``flap_window_s`` are counted in windows with data times
    # ``window_s``: on a step-paced job (one window with data per step, 2-10 s apart) they span that many
    # steps. Measured on event seconds instead, the paced dev runs split and re-alarm (17.17 -> 21.93
    # false alarms/h; docs/evaluation/2026-11-29-session25.md).
    merge_s: float = 5.0                     # alarms this soon after an incident's detection join it
    merge_similar_s: float = 30.0            # ... or this soon after its onset with a similar shift
    step_ratio: float = 1.1                  # an incident's level moving again by this (deeper or
                                             # softer) is a change of its own (`dynamiccl.detector.steps`)
    recovery_fraction: float = 0.3           # back within this fraction of the shift (mean of the run
                                             # below) = recovered
    recovery_windows: int = 2                # ... over this many consecutive windows nearer the old level
    flap_transitions: int = 2                # off->on transitions that make an incident "flapping"
    recovery_drain: bool = True              # a degradation within ``flap_window_s`` of a recovery, on its
                                             # streams, at a level within ``recovery_fraction`` of it:
                                             # the release draining (`dynamiccl.detector.fusion_drain`)
    flap_window_s: float = 10.0              # ... within this span (also: re-onset after a recovery);
                                             # a flapping incident recovers after half of it quiet.
                                             # Longer spans called separate regimes 10-30 s apart
                                             # (a throttle, its release, the next throttle) one
                                             # flapping change whose release came 15 s late
                                             # (docs/evaluation/2026-11-27-detection.md)
    regime_spread: bool = True               # a deeper step's z in the larger of the old sigma and the
                                             # degraded regime's own spread (`dynamiccl.detector.regime_spread`)
    softer_release: bool = True              # a recovery within ``merge_s`` of the incident's softer step
                                             # is that step's release: no second change, the retuner
                                             # hears of it (`dynamiccl.detector.softer_release`)
    post_recovery_hold: bool = False         # a degradation within ``flap_window_s`` of the job's reported
                                             # recovery needs one more confirming window
                                             # (`dynamiccl.detector.post_recovery`; off: on the corpus's
                                             # evaluation half it lost a change within 5 s for the false
                                             # alarm it saved; docs/evaluation/2026-11-28-fa25b.md)
    adopt_improvement: bool = True           # an improvement no open degradation explains is reported once and
                                             # its level becomes the baseline: no `recovery` when the job
                                             # slows again (`dynamiccl.detector.adopt_improvement`)
    transient_s: float = 10.0                # > 0: an incident of one report back within this of
                                             # its onset and half of it of its report is a transient,
                                             # closed without a `recovery` (10 s = twice the 5 s
                                             # target); the retuner hears of it through the loop
                                             # (`TransientEnd`) and reverts as on a recovery.
                                             # 0 = off (dynamiccl/detector/README.md, Transients)

    def validate(self) -> "IncidentConfig":
        self._positive("merge_s", "merge_similar_s", "flap_window_s")
        self._within("transient_s", 0)
        self._within("step_ratio", 1, open_lo=True)
        self._within("recovery_fraction", 0, 1, open_lo=True, open_hi=True)
        self._positive("recovery_windows", "flap_transitions", integer=True)
        return self


@dataclass(frozen=True)
class WorkloadConfig(_Group):
    """A job's new collective mix or lost ranks: re-baselined, not reported as a change."""

    KEY: ClassVar[str] = "workload"
    mix_change: float = 0.08                 # |log| change of bytes per record that marks a new mix
    coverage_change: float = 0.04            # |log| change of ranks reporting per instance
    rank_set_keep: bool = True               # a rank-set change whose latency stays within the small-shift
                                             # chart's reference value of the level keeps the baseline
                                             # (`stream_rebase.KEEP_SIGMAS`), no new warm-up
    straddle_union: bool = False             # a rank-set loss in two successive windows whose ranks together
                                             # are all the ranks is one straddling instance (`rank_straddle`)
    settle_windows: int = 5                  # windows after a job's workload change whose alarms are part of it
    settle_ratio: float = 1.15               # ... when they shift latency by less than this
    settle_share: float = 0.02               # ... and the changed streams took this share of the
                                             # job's collective time (instances x latency)
    settle_chain: bool = False               # a side-effect alarm extends the settling time (the old
                                             # behaviour: one mix could blind the whole job in turn)

    def validate(self) -> "WorkloadConfig":
        self._switches()
        self._positive("mix_change", "coverage_change", "settle_share")
        self._positive("settle_windows", integer=True)
        self._within("settle_ratio", 1)
        return self


@dataclass(frozen=True)
class StragglerConfig(_Group):
    """Naming a slow rank from which rank is strictly shortest in each complete instance."""

    KEY: ClassVar[str] = "straggler"
    share: float = 0.6                       # share of complete instances a rank is strictly shortest in
    min_instances: int = 3
    recheck: bool = True                     # a straggler named from its onset's window alone, on
                                             # < 2 x min_instances instances or on collectives
                                             # >= 2 % of a window long, is named one window later,
                                             # on both windows
    trigger_z: float = 8.0                   # rank evidence alone opens a straggler change at this
                                             # binomial z over two windows (0: off)
    where_refresh_windows: int = 3           # a reported change's `where` is judged again on this many
                                             # later windows; a verdict naming another place is handed
                                             # out as a `WhereUpdate` (`where_refresh.py`; 0: off)

    def validate(self) -> "StragglerConfig":
        self._switches()
        self._within("share", 0.5, 1)
        self._positive("min_instances", integer=True)
        v = self.where_refresh_windows
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            self._fail("where_refresh_windows", "an int >= 0")
        self._within("trigger_z", 0)
        return self


@dataclass(frozen=True)
class AutoencoderConfig(_Group):
    """The per-job torch autoencoder over window features (``dynamiccl.detector.autoencoder``)."""

    KEY: ClassVar[str] = "autoencoder"
    enabled: bool = True                     # off: no torch import, CUSUM banks and fusion only
    grace: int = 60                          # windows learned before its score counts
    seed: int = 0

    def validate(self) -> "AutoencoderConfig":
        self._switches()
        self._positive("grace", integer=True)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            self._fail("seed", "an int")
        return self


@dataclass(frozen=True)
class OutputConfig(_Group):
    """What the service exports besides the changes."""

    KEY: ClassVar[str] = "outputs"
    top_statistics: int = 50                 # cusum_statistic series exported per job (largest)

    def validate(self) -> "OutputConfig":
        self._positive("top_statistics", integer=True)
        return self


#: group name in DetectorConfig (and in dotted keys) -> its class
GROUPS: dict[str, type] = {g.KEY: g for g in (CusumConfig, BaselineConfig, StreamsConfig, FusionConfig,
                                               IncidentConfig, WorkloadConfig, StragglerConfig,
                                               AutoencoderConfig, OutputConfig)}
