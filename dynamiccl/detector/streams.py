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
from .warmup_split import split_warmups
from .warmup_stash import WarmupStash
from .stream_group import STREAM_KEY, group_streams, rank_masks, reporting
from .wait_streams import with_wait_rows
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


class StreamTable(StreamBaselines, StreamRebase, StreamIndex):
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
        cfg = self.config
        self.t += 1
        t = self.t
        self.last_rebased = np.zeros(0, np.int64)
        H = cfg.streams.history
        self._window_s = float(wf.window_s) if wf.window_s and wf.window_s > 0 else 1.0
        self.window_starts[t % H] = wf.window_start
        invalid: dict[str, int] = {}
        keys = (self.step_rate.with_rows(wf.keys, float(wf.window_start), self._window_s)
                if cfg.streams.step_rate else wf.keys)
        keys = with_wait_rows(keys, getattr(wf, "waits", None))
        agg, h = group_streams(keys)
        n_rows = agg.height
        if n_rows:
            idx = self._lookup(agg, h)
        else:
            idx = np.zeros(0, np.int64)
        keep = idx >= 0
        if (~keep).any():
            invalid["stream_limit"] = int((~keep).sum())
        lat = agg.get_column("lat").to_numpy().astype(np.float64) if n_rows else np.zeros(0)
        lat90 = agg.get_column("lat90").to_numpy().astype(np.float64) if n_rows else np.zeros(0)
        inst = agg.get_column("instances").to_numpy() if n_rows else np.zeros(0, np.int64)
        rec = agg.get_column("records").to_numpy() if n_rows else np.zeros(0, np.int64)
        byt = agg.get_column("bytes_total").to_numpy().astype(np.float64) if n_rows else np.zeros(0)
        bits = agg.get_column("ap_bits").to_numpy().astype(np.uint64) if n_rows else np.zeros(0, np.uint64)
        with np.errstate(invalid="ignore", divide="ignore"):
            nan = ~np.isfinite(lat)
            nonpos = ~nan & (lat <= 0)
            absurd = ~nan & (lat > cfg.streams.max_latency_s)
            sparse = ~(nan | nonpos | absurd) & (inst < cfg.streams.min_instances)
        rep_pool = None
        if (sparse & keep).any():
            # too few instances for a statistic: pooled with the stream's next windows until
            # there are enough (`dynamiccl.detector.sparse`); the window completing a pool carries it
            rows = np.flatnonzero(sparse & keep)
            rep_pool = np.full(n_rows, -2, np.int64)   # -2: not pooled (the window's own count)
            rep_pool[rows] = self.pool.ranks_reporting(idx[rows], rank_masks(agg, wf.ranks)[rows],
                                                       reporting(agg, wf.ranks)[rows] >= 0)
            done, pooled = self.pool.add(idx[rows], np.log(lat[rows]), inst[rows], cfg.streams.min_instances)
            lat, lat90, sparse = lat.copy(), lat90.copy(), sparse.copy()
            lat[rows[done]] = pooled
            lat90[rows[done]] = np.nan
            sparse[rows[done]] = False
        for name, m in (("nan", nan), ("nonpositive", nonpos), ("absurd", absurd), ("sparse", sparse)):
            c = int((m & keep).sum())
            if c:
                invalid[name] = c
        ok = keep & ~(nan | nonpos | absurd | sparse)
        self.pool.clear(idx[ok & (inst >= cfg.streams.min_instances)])   # a whole window needs no pool
        idx_all = idx[keep]
        prev = self.last_seen[idx_all]
        # first data after a gap in a stream (a checkpoint pause, a restart; a silence longer
        # than 1.5x its usual interval): its next windows are settling, and the fusion stage
        # wants them confirmed
        with np.errstate(invalid="ignore"):
            thin = self.instances_ref[idx_all] < cfg.streams.min_instances
        codes = self.job_code[idx_all].astype(np.int64)
        self.cadence.observe(codes, wf.window_start, self._window_s)
        gap = self.pool.gap(idx_all, wf.window_start - prev, self._window_s, thin, self.cadence.usual(codes))
        self.gap_step[idx_all[gap]] = t
        self.last_seen[idx_all] = wf.window_start
        # ---- benign workload / configuration changes -------------------------------------
        i_ok = idx[ok]
        with np.errstate(invalid="ignore", divide="ignore"):
            bpr = byt[ok] / np.maximum(rec[ok], 1)
            cov = rec[ok] / np.maximum(inst[ok], 1)     # ranks reporting per instance
        self.bytes_per_record[i_ok] = bpr
        self.coverage[i_ok] = cov
        rep_ok = reporting(agg, wf.ranks)[ok] if n_rows else np.zeros(0, np.int64)
        if rep_pool is not None:   # a pooled sample: the ranks seen over its windows
            rep_ok = np.where(rep_pool[ok] != -2, rep_pool[ok], rep_ok)
        self.reporting[i_ok] = rep_ok
        self.instances[:] = 0.0
        self.instances[i_ok] = inst[ok]
        ref = self.bytes_ref[i_ok]
        first = np.isnan(ref)
        cref = self.coverage_ref[i_ok]
        with np.errstate(invalid="ignore", divide="ignore"):
            moved = ~first & (np.abs(np.log(bpr / ref)) > cfg.workload.mix_change)
            # a rank or a host stopped (or started) reporting: the stream's make-up changed
            lost = ~first & (np.abs(np.log(cov / cref)) > cfg.workload.coverage_change)
        # ... but only if ranks stopped or started reporting: with every rank still there, fewer
        # records per instance are instances straddling the window's edge, which a slowdown
        # makes more frequent (a throttled test-bed rank reset its streams 40-66 times a run
        # instead of alarming); without rank information the coverage alone decides
        rref = self.reporting_ref[i_ok]
        same_ranks = (rref >= 0) & (rep_ok >= 0) & (rep_ok == rref)
        lost &= ~same_ranks
        # ... in two successive windows with data: a step-paced job's instance straddling a
        # window's edge leaves one rank out of that window only (its streams were re-learning
        # for ever instead of being monitored)
        lost &= ~self._shifted(i_ok, np.log(lat[ok]))   # a slowed rank, not a gone one
        lost_now = lost.copy()
        lost = self.straddle.split(i_ok, lost_now, lost & self.lost_prev[i_ok],   # `rank_straddle`
                                   lambda: rank_masks(agg, wf.ranks)[ok], rref)
        self.lost_prev[i_ok] = lost_now & ~lost
        self.rank_set_changed[:] = False
        self.rank_set_changed[i_ok] = ~first & ~same_ranks
        b_ok = bits[ok]
        b_ref = self.ap_ref[i_ok]
        cfg_changed = (b_ref != 0) & ((b_ok & b_ref) == 0)
        rebase = moved | cfg_changed | lost
        self.bytes_ref[i_ok[first]] = bpr[first]
        self.coverage_ref[i_ok[first]] = cov[first]
        self.reporting_ref[i_ok[first]] = rep_ok[first]
        rebased = i_ok[rebase]
        resized = i_ok[rebase & (moved | cfg_changed)]
        if rebased.size:
            self._rebase_streams(rebased, bpr[rebase], cov[rebase])
        # a stream re-learning after a workload change whose workload is back to the previous
        # one by now (the change's first window mixed both sizes, so it did not match then):
        # its previous baseline comes back (no 60-window blind spell after a short mix)
        back = self.rebase_warm[i_ok] & ~rebase
        if back.any():
            j = i_ok[back]
            with np.errstate(invalid="ignore", divide="ignore"):
                match = (np.isfinite(self.prev_scale[j])
                         & (np.abs(np.log(bpr[back] / self.prev_bpr[j])) <= 0.5 * cfg.workload.mix_change)
                         & (np.abs(np.log(cov[back] / self.prev_cov[j])) <= 0.5 * cfg.workload.coverage_change))
            j = j[match]
            if j.size:
                self._adopt(j, self.prev_med[j], self.prev_scale[j], np.maximum(self.prev_n[j], 1))
                self.bytes_ref[j] = bpr[back][match]
                self.coverage_ref[j] = cov[back][match]
                self.reporting_ref[j] = self.reporting[j]
                self.rebase_warm[j] = False
                self.monitor_since[j] = t
                self.n_restored += int(j.size)
        self.ap_ref[i_ok] = b_ok
        # typical instances per window (EWMA), to spot partial windows
        iref = self.instances_ref[i_ok]
        self.instances_ref[i_ok] = np.where(np.isnan(iref) | rebase, inst[ok], 0.9 * iref + 0.1 * inst[ok])
        # ---- CUSUM ----------------------------------------------------------------------
        x_valid = np.log(lat[ok])
        with np.errstate(invalid="ignore", divide="ignore"):
            sp = np.log(lat90[ok]) - x_valid
        self.spread_prev[i_ok] = self.spread[i_ok]
        self.spread[i_ok] = np.where(np.isfinite(sp) & (sp >= 0), sp, np.nan)
        x = np.full(self.capacity, np.nan)
        x[i_ok] = x_valid
        self._learnable = np.ones(i_ok.size, bool)
        if cfg.baseline.instance_weight > 0 and i_ok.size:
            # the median of a window with far fewer instances than usual is noisier (its
            # sampling variance grows like 1 / instances) and often a phase's edge: its deviation
            # from the baseline enters the CUSUM shrunk by sqrt(instances / (instance_weight x
            # typical)) (history and fusion keep the raw value)
            # (not a step-rate stream: its fewer instances are the signal, not a thinner sample)
            mon = ~self.banks[0].warming_up[i_ok] & ~rebase & ~self.is_step[i_ok]
            with np.errstate(invalid="ignore", divide="ignore"):
                w = np.sqrt(inst[ok] / (cfg.baseline.instance_weight * iref))
            mon &= np.isfinite(w) & (w < 1.0)
            if mon.any():
                j = i_ok[mon]
                med = self.banks[0].baseline[0][j]
                x[j] = med + (x_valid[mon] - med) * w[mon]
                self._learnable[mon] = False   # a thin window's median is not baseline material
        self.hist[t % H] = np.nan
        self.hist[t % H, i_ok] = x_valid
        self.inst_hist[t % H] = 0
        self.inst_hist[t % H, idx[keep]] = inst[keep]      # every instance seen, pooled or not
        warming_before = self.banks[0].warming_up
        u = self._standardise(i_ok, x, warming_before)
        with np.errstate(invalid="ignore"):
            thin_ok = self.instances_ref[i_ok] < cfg.streams.min_instances   # pooled samples
        self.early.arl0 = float(self.arl0)
        thin_ok, confirm = self.paced_warmup.charted(self.cadence, self.job_code[i_ok].astype(np.int64), thin_ok,
                                                     self._window_s)
        early = self.early.check(t, i_ok, self.job_code[i_ok], x[i_ok], self.banks[0], thin_ok,
                                 float(wf.window_start), self._window_s, confirm)
        for bank in self.banks:
            bank.update_many(x)
        done = np.flatnonzero(warming_before & ~self.banks[0].warming_up)
        done = split_warmups(self, done)              # a warm-up holding two regimes restarts
        self.monitor_since[done] = t
        self.early.monitored(done)
        if done.size:
            med, scale = self.banks[0].baseline
            sc, nv = scale[done], np.full(done.size, cfg.baseline.warmup, np.int64)
            if cfg.baseline.self_start:
                sc, nv = self.ss.pooled_scale(self.carry_scale[done], self.carry_n[done], sc, cfg.baseline.warmup)
            self.ss.start(done, med[done], sc, cfg.baseline.warmup, nv)
            self.carry_n[done] = 0
            moved = done[(sc != scale[done]) | (sc < self._floor(done))]
            if moved.size:
                for bank in self.banks:
                    bank.set_baseline(moved, med[moved], np.maximum(np.sqrt(self.ss.var[moved]), self._floor(moved)))
            self.rebase_warm[done] = False
        fired_any = self.banks[0].drift_detected.copy()
        for bank in self.banks[1:]:
            fired_any |= bank.drift_detected
        fired = np.flatnonzero(fired_any)
        if fired.size:
            direction = np.zeros(fired.size, np.int8)
            start = np.full(fired.size, -1, np.int64)
            for bank in self.banks:
                # the latest reset point among the banks that fired: the tightest onset estimate
                f = bank.drift_detected[fired]
                direction = np.where(f & (direction == 0), bank.direction[fired], direction)
                start = np.where(f, np.maximum(start, bank.change_start[fired]), start)
            med, scale = self.banks[0].baseline
            base_med, base_scale = med[fired].copy(), scale[fired].copy()
            self.saved_med[fired] = base_med
            self.saved_n[fired] = self.ss.n[fired]
            self.carry_scale[fired] = np.sqrt(self.ss.var[fired])
            self.carry_n[fired] = self.ss.n_var[fired]
            self.ss.n[fired] = 0
            self.rebase_warm[fired] = False
            # the other banks reset too (one baseline per stream); the next update re-warms all
            for bank in self.banks:
                bank.reset_streams(fired)
        else:
            direction = np.zeros(0, np.int8)
            start = np.zeros(0, np.int64)
            base_med = base_scale = np.zeros(0)
        if early.idx.size:
            fired, direction, start, base_med, base_scale = self._add_early(
                early, fired, direction, start, base_med, base_scale)
        if u is not None:
            self._learn(i_ok, x_valid, u, fired_any)
        if t % 64 == 63:
            self._evict(wf.window_start)
        return WindowStreams(t, wf.window_start, i_ok, x_valid, fired, direction, start, base_med,
                             base_scale, self.last_rebased, invalid, resized)

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
