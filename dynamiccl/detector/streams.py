"""Per-stream state of the detector: the (job, communicator, collective, size bucket) streams of
the collector's ``keys`` frame, their CUSUM banks and a short history.

One call per window, :meth:`StreamTable.update`, does everything vectorised:

1. groups the ``keys`` rows of a window by stream (rows differ by algo/proto), taking the
   ``lat_p50_s`` of the row with most records, summing records, instances and bytes;
2. maps each stream to a dense index (64-bit hash + sorted array; new streams get a slot, idle
   ones are forgotten and their slot reused);
3. checks the input: null/NaN, non-positive or absurd latencies and windows with fewer than
   ``min_instances`` instances are skipped and counted (never fed to a detector);
4. checks for *benign* workload changes: a stream whose bytes per record move by more than
   ``workload_change`` (log), whose (algo, proto) set changes completely (a new message-size
   mix, or a retuned configuration) or whose ranks reporting per instance change by more than
   ``coverage_change`` (a rank or host vanished from the stream, e.g. its clock jumped) is
   re-baselined instead of alarming;
5. feeds ``log(lat_p50_s)`` to one `CUSUMBank` per configured delta (a window with fewer than
   ``instance_weight`` x its usual instances shrunk towards the baseline by
   sqrt(instances / (instance_weight x usual)): a noisier median), standardised against a
   self-starting baseline (`dynamiccl.detector.self_start`: monitored after ``warmup`` windows, learning
   from its in-control windows after that) whose scale is floored at ``scale_floor``; the
   thresholds are the known-baseline ones for the per-stream ARL0
   (`dynamiccl.detector.arl.cusum_threshold_correlated`, for ``long_run_variance``).
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dynamiccl.collector.features import WindowFeatures

from .config import DetectorConfig
from .cusum_bank import CUSUMBank
from .early import EarlyChart
from .paced_warmup import PacedWarmup
from .rank_straddle import RankStraddle
from .self_start import SelfStart
from .sparse import InstancePool, JobCadence
from .step_rate import StepRate
from .stream_baseline import FIXED_BASELINE_MIN, KNOWN_BASELINE, StreamBaselines
from .stream_columns import alloc_columns, grow_columns
from .warmup_stash import WarmupStash
from .stream_group import STREAM_KEY
from .stream_window import StreamRows
from .stream_index import StreamIndex
from .stream_rebase import StreamRebase

__all__ = ["StreamTable", "WindowStreams", "STREAM_KEY", "KNOWN_BASELINE", "FIXED_BASELINE_MIN"]

_GROW = 1024


@dataclass
class WindowStreams:
    """What one window did to the streams (indices into the table)."""
    t: int                        # bank step index of this window
    window_start: float
    idx: np.ndarray               # streams with a valid value this window
    x: np.ndarray                 # their log(lat_p50_s)
    fired: np.ndarray             # indices of streams that alarmed (any bank)
    direction: np.ndarray         # +1 / -1 per fired stream
    start_step: np.ndarray        # CUSUM change start (bank step) per fired stream
    base_median: np.ndarray       # pre-alarm baseline (log) per fired stream
    base_scale: np.ndarray        # pre-alarm baseline sigma (log) per fired stream
    rebased: np.ndarray           # streams re-baselined for a workload/config change
    invalid: dict[str, int] = field(default_factory=dict)
    resized: np.ndarray | None = None   # the rebased streams whose sizes or config changed (not
                                        # only their coverage): a workload change (None: all)
    evicted: np.ndarray | None = None   # streams forgotten this window (unseen for ``streams.idle_s``)


class StreamTable(StreamBaselines, StreamRebase, StreamRows, StreamIndex):
    """All streams of all jobs; see the module docstring."""

    def __init__(self, config: DetectorConfig | None = None):
        self.config = cfg = (config or DetectorConfig()).validate()
        self.banks = [CUSUMBank(n_streams=_GROW, delta=float(d), arl0=cfg.cusum.arl0, warmup=cfg.baseline.warmup,
                                mode="both", min_value=None, z_clip=1e9,
                                estimator=cfg.baseline.estimator) for d in cfg.cusum.deltas]
        for bank in self.banks:
            bank.narrow_scale = cfg.baseline.diff_scale
        self.capacity = _GROW
        self.n = 0                                   # slots ever used (high-water mark)
        self._free: list[int] = []
        self._hash_sorted = np.zeros(0, np.uint64)
        self._hash_idx = np.zeros(0, np.int64)
        self.key_of: dict[int, tuple] = {}           # idx -> (job_id, comm_hash, func, size_bucket)
        self._prev_lookup: tuple[np.ndarray, np.ndarray] | None = None
        self.jobs: dict[str, int] = {}               # job_id -> code (job_code array)
        self._alloc_arrays(_GROW)
        self.t = -1                                  # bank step of the last window
        self.window_starts = np.full(cfg.streams.history, np.nan)
        self.hist = np.full((cfg.streams.history, _GROW), np.nan)   # (window slot, stream)
        self.inst_hist = np.zeros((cfg.streams.history, _GROW), np.int64)   # instances per window
        self.n_dropped_streams = 0
        self.n_rebased = 0
        self.n_restored = 0
        self.n_rank_set_kept = 0                     # rank-set changes that kept the baseline
        # (level, baseline sigma) of streams in an open incident, NaN elsewhere: set by the
        # fusion stage (`Fusion.incident_level`); a re-learning stream's level until its warm-up
        # has ``early_min`` samples (`stream_rebase._level`)
        self.incident_level: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
        self.n_warmup_splits = 0                     # warm-ups restarted from a later regime
        self.n_refined = 0                           # in-control windows learned by baselines
        self.pool = InstancePool(_GROW)
        self.straddle = RankStraddle(_GROW, cfg.workload.straddle_union)
        self.cadence = JobCadence()
        self.paced_warmup = PacedWarmup(cfg.baseline.paced_warmup)
        self.warm_stash = WarmupStash(cfg.baseline.resume_warmup)
        self.step_rate = StepRate()
        self.ss = SelfStart(_GROW, memory=cfg.baseline.memory, long_run_variance=cfg.cusum.long_run_variance)
        b = cfg.baseline
        self.early = EarlyChart(_GROW, warmup=b.warmup, ratio=b.early_ratio, z=b.early_z, min_samples=b.early_min,
                                scale_floor=b.scale_floor, deltas=cfg.cusum.deltas, arl0=cfg.cusum.arl0,
                                confirm_z=cfg.fusion.confirm_z, per_chart=b.chart_excursions, step=b.warmup_step,
                                two_step=b.paced_two_step,
                                corroborate=cfg.fusion.corroborate)
        self.last_rebased = np.zeros(0, np.int64)
        self.last_evicted = np.zeros(0, np.int64)
        self.arl0 = cfg.cusum.arl0
        self._set_thresholds()

    # ------------------------------------------------------------------ storage
    def _alloc_arrays(self, cap: int) -> None:
        alloc_columns(self, cap)

    def _grow(self, need: int) -> None:
        new_cap = max(self.capacity * 2, need + _GROW)
        extra = new_cap - self.capacity
        for bank in self.banks:
            bank.grow(extra)
        self.ss.grow(extra)
        self.early.grow(extra)
        self.pool.grow(extra)
        self.straddle.grow(extra)

        grow_columns(self, extra)
        self.hist = np.concatenate([self.hist, np.full((self.hist.shape[0], extra), np.nan)], axis=1)
        self.inst_hist = np.concatenate([self.inst_hist, np.zeros((self.hist.shape[0], extra), np.int64)], axis=1)
        self.capacity = new_cap

    @property
    def n_active(self) -> int:
        return int(self.active.sum())

    def window_start_of(self, step) -> np.ndarray:
        """Window start (event time) of bank steps (vectorised; steps older than the history are
        extrapolated from the window length)."""
        step = np.asarray(step, dtype=np.int64)
        H = self.config.streams.history
        ws = self.window_starts[step % H]
        old = (self.t - step) >= H
        if old.any():
            last = self.window_starts[self.t % H]
            ws = np.where(old, last - (self.t - step) * self._window_s, ws)
        return ws

    # ------------------------------------------------------------------ per window
    def update(self, wf: WindowFeatures) -> WindowStreams:
        self.t += 1
        t = self.t
        self.last_rebased = np.zeros(0, np.int64)
        self.last_evicted = np.zeros(0, np.int64)
        H = self.config.streams.history
        self._window_s = float(wf.window_s) if wf.window_s and wf.window_s > 0 else 1.0
        self.window_starts[t % H] = wf.window_start
        r = self._rows(wf)                                     # `stream_window`
        self._note_gaps(r, wf.window_start)
        iref = self.instances_ref[r.idx[r.ok]]
        rebase, resized = self._workload(r, wf)                # `stream_rebase`
        ok = r.ok
        i_ok = r.idx[ok]
        inst = r.inst[ok]
        # typical instances per window (EWMA), to spot partial windows
        self.instances_ref[i_ok] = np.where(np.isnan(iref) | rebase, inst, 0.9 * iref + 0.1 * inst)
        x_valid = np.log(r.lat[ok])
        with np.errstate(invalid="ignore", divide="ignore"):
            sp = np.log(r.lat90[ok]) - x_valid
        self.spread_prev[i_ok] = self.spread[i_ok]
        self.spread[i_ok] = np.where(np.isfinite(sp) & (sp >= 0), sp, np.nan)
        x = self._chart_input(i_ok, x_valid, inst, iref, rebase)
        self.hist[t % H] = np.nan
        self.hist[t % H, i_ok] = x_valid
        self.inst_hist[t % H] = 0
        self.inst_hist[t % H, r.idx[r.keep]] = r.inst[r.keep]      # every instance seen, pooled or not
        warming_before = self.banks[0].warming_up
        u = self._standardise(i_ok, x, warming_before)
        early = self._early_check(wf, i_ok, x)
        for bank in self.banks:
            bank.update_many(x)
        self._warmups_done(warming_before)
        fired_any, fired, direction, start, base_med, base_scale = self._collect_fired()
        if early.idx.size:
            fired, direction, start, base_med, base_scale = self._add_early(
                early, fired, direction, start, base_med, base_scale)
        if u is not None:
            self._learn(i_ok, x_valid, u, fired_any)
        if t % 64 == 63:
            self._evict(wf.window_start)
        return WindowStreams(t, wf.window_start, i_ok, x_valid, fired, direction, start, base_med,
                             base_scale, self.last_rebased, r.invalid, resized, self.last_evicted)

    def _chart_input(self, i_ok, x_valid, inst, iref, rebase) -> np.ndarray:
        """The value each stream's banks see: its log latency, except that the median of a window
        with far fewer instances than usual is noisier (its sampling variance grows like
        1 / instances) and often a phase's edge: its deviation from the baseline enters the CUSUM
        shrunk by sqrt(instances / (instance_weight x typical)); history and fusion keep the raw
        value. A step-rate stream is never shrunk: its fewer instances are the signal."""
        cfg = self.config
        x = np.full(self.capacity, np.nan)
        x[i_ok] = x_valid
        self._learnable = np.ones(i_ok.size, bool)
        if cfg.baseline.instance_weight > 0 and i_ok.size:
            mon = ~self.banks[0].warming_up[i_ok] & ~rebase & ~self.is_step[i_ok]
            with np.errstate(invalid="ignore", divide="ignore"):
                w = np.sqrt(inst / (cfg.baseline.instance_weight * iref))
            mon &= np.isfinite(w) & (w < 1.0)
            if mon.any():
                j = i_ok[mon]
                med = self.banks[0].baseline[0][j]
                x[j] = med + (x_valid[mon] - med) * w[mon]
                self._learnable[mon] = False   # a thin window's median is not baseline material
        return x

    def _early_check(self, wf: WindowFeatures, i_ok: np.ndarray, x: np.ndarray):
        """The early chart's verdicts on warming streams (`dynamiccl.detector.early`)."""
        with np.errstate(invalid="ignore"):
            thin_ok = self.instances_ref[i_ok] < self.config.streams.min_instances   # pooled samples
        self.early.arl0 = float(self.arl0)
        thin_ok, confirm = self.paced_warmup.charted(self.cadence, self.job_code[i_ok].astype(np.int64), thin_ok,
                                                     self._window_s)
        return self.early.check(self.t, i_ok, self.job_code[i_ok], x[i_ok], self.banks[0], thin_ok,
                                float(wf.window_start), self._window_s, confirm)

    def recent(self, idx, since_step: int) -> np.ndarray:
        """Mean of the valid values of streams ``idx`` from bank step ``since_step`` to now."""
        H = self.config.streams.history
        lo = max(since_step, self.t - H + 1)
        steps = np.arange(lo, self.t + 1) % H
        if steps.size == 0:
            return np.full(len(idx), np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmedian(self.hist[steps][:, np.asarray(idx, np.int64)], axis=0)

    def instances_since(self, idx, since_step: int) -> int:
        """Instances of streams ``idx`` (the most of any one) from bank step ``since_step`` to
        now, within the history: a delay in instances (sparse jobs count steps, not seconds)."""
        H = self.config.streams.history
        lo = max(since_step, self.t - H + 1)
        steps = np.arange(lo, self.t + 1) % H
        if steps.size == 0 or len(idx) == 0:
            return 0
        idx = np.asarray(idx, np.int64)
        lat = ~self.is_step[idx]      # a step-rate stream counts every collective of its comm
        idx = idx[lat] if lat.any() else idx
        return int(self.inst_hist[steps][:, np.asarray(idx, np.int64)].sum(axis=0).max())

    def current(self, idx) -> np.ndarray:
        return self.hist[self.t % self.config.streams.history, np.asarray(idx, np.int64)]
