"""The stream table's workload re-baselining: a stream whose sizes, configuration or rank set
changed gets a new warm-up, or the baseline of the workload it had before (an A -> B -> A mix
costs no blind warm-up)."""
from __future__ import annotations

import math

import numpy as np

from .stream_group import rank_masks, reporting

__all__ = ["StreamRebase", "LOST_RANK_SHIFT", "KEEP_SIGMAS"]

# a stream whose latency moved this much (|log|, 1.5x) in the window its rank set changed is
# slowed, not re-made: a throttled or bulk-loaded rank's records miss the window (test bed:
# 2-4 rank jobs lost the slowed rank from 2-3 successive windows at 12 of 26 dev changes that
# re-based instead of alarming); a rank that vanishes or whose clock jumps leaves the others'
# latency where it was
LOST_RANK_SHIFT = math.log(1.5)
# a stream whose rank set changed while its value stayed within this many times the small-shift
# chart's reference value (min(cusum.deltas) / 2 baseline sigmas) of its level keeps its baseline:
# a move that small does not drive that chart, so the make-up change needs no new warm-up (a
# rank whose records stop, a host whose clock steps by more than a window)
KEEP_SIGMAS = 1.0


class StreamRebase:
    """Mixin of `StreamTable`."""

    def _workload(self, r, wf) -> tuple[np.ndarray, np.ndarray]:
        """Benign workload / configuration changes among this window's charted rows ``r``
        (`dynamiccl.detector.stream_window.WindowRows`): returns (rebase, resized), the rows whose
        streams were re-baselined and those among them whose sizes or configuration changed."""
        cfg = self.config
        ok = r.ok
        i_ok = r.idx[ok]
        with np.errstate(invalid="ignore", divide="ignore"):
            bpr = r.byt[ok] / np.maximum(r.rec[ok], 1)
            cov = r.rec[ok] / np.maximum(r.inst[ok], 1)     # ranks reporting per instance
        self.bytes_per_record[i_ok] = bpr
        self.coverage[i_ok] = cov
        rep_ok = reporting(r.agg, wf.ranks)[ok] if r.agg.height else np.zeros(0, np.int64)
        if r.rep_pool is not None:   # a pooled sample: the ranks seen over its windows
            rep_ok = np.where(r.rep_pool[ok] != -2, r.rep_pool[ok], rep_ok)
        self.reporting[i_ok] = rep_ok
        self.instances[:] = 0.0
        self.instances[i_ok] = r.inst[ok]
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
        if lost.any():                                     # a slowed rank, not a gone one
            lost[lost] = ~self._shifted(i_ok[lost], np.log(r.lat[ok][lost]))
        lost_now = lost.copy()
        lost = self.straddle.split(i_ok, lost_now, lost & self.lost_prev[i_ok],   # `rank_straddle`
                                   lambda: rank_masks(r.agg, wf.ranks)[ok], rref)
        self.lost_prev[i_ok] = lost_now & ~lost
        if cfg.workload.rank_set_keep and lost.any():
            lost = self._keep_level(i_ok, lost, np.log(r.lat[ok]), cov, rep_ok)
        self.rank_set_changed[:] = False
        self.rank_set_changed[i_ok] = ~first & ~same_ranks
        b_ok = r.bits[ok]
        b_ref = self.ap_ref[i_ok]
        cfg_changed = (b_ref != 0) & ((b_ok & b_ref) == 0)
        rebase = moved | cfg_changed | lost
        self.bytes_ref[i_ok[first]] = bpr[first]
        self.coverage_ref[i_ok[first]] = cov[first]
        self.reporting_ref[i_ok[first]] = rep_ok[first]
        if rebase.any():
            self._rebase_streams(i_ok[rebase], bpr[rebase], cov[rebase])
        self._workload_back(i_ok[~rebase], bpr[~rebase], cov[~rebase])
        self.ap_ref[i_ok] = b_ok
        return rebase, i_ok[rebase & (moved | cfg_changed)]

    def _workload_back(self, idx: np.ndarray, bpr: np.ndarray, cov: np.ndarray) -> None:
        """A stream re-learning after a workload change whose workload is back to the previous
        one by now (the change's first window mixed both sizes, so it did not match then): its
        previous baseline comes back (no 60-window blind spell after a short mix)."""
        cfg = self.config
        back = self.rebase_warm[idx]
        if not back.any():
            return
        j = idx[back]
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
            self.monitor_since[j] = self.t
            self.n_restored += int(j.size)

    def rebase(self, idx) -> None:
        """Treat streams ``idx`` as changed workload: new size reference, new warm-up."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        self._rebase_streams(idx, self.bytes_per_record[idx], self.coverage[idx])

    def _shifted(self, idx: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Streams ``idx`` whose value ``x`` (log latency) is >= `LOST_RANK_SHIFT` from their
        level (`_level`; False where it is not known)."""
        with np.errstate(invalid="ignore"):
            return np.abs(x - self._level(idx)[0]) >= LOST_RANK_SHIFT

    def _keep_level(self, idx: np.ndarray, lost: np.ndarray, x: np.ndarray, cov: np.ndarray,
                    rep: np.ndarray) -> np.ndarray:
        """Of the rank-set changes ``lost`` among streams ``idx`` (values ``x``, log latency), those
        whose value stays within `KEEP_SIGMAS` x the small-shift chart's reference value of their
        level keep their baseline: the new rank set becomes the reference, no warm-up (counted in
        ``n_rank_set_kept``). Returns the rank-set changes left to re-baseline."""
        ref, scale = self._level(idx[lost])
        k = 0.5 * float(min(self.config.cusum.deltas))
        with np.errstate(invalid="ignore"):
            held = np.abs(x[lost] - ref) <= KEEP_SIGMAS * k * np.maximum(scale, self.config.baseline.scale_floor)
        keep = np.zeros(lost.size, bool)
        keep[np.flatnonzero(lost)[held]] = True
        if keep.any():
            j = idx[keep]
            self.coverage_ref[j] = cov[keep]
            self.reporting_ref[j] = rep[keep]
            self.n_rank_set_kept += int(keep.sum())
        return lost & ~keep

    def _level(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Level and sigma (log latency) of streams ``idx``: the monitored baseline, or the median
        and MAD sigma of a warm-up with ``early_min`` samples, or else the level of the open
        incident the stream is in (its re-learning after the alarm has just begun) with its
        pre-change sigma (NaN where none is known)."""
        ref, scale = self._table_level(idx)
        unknown = np.isnan(ref)
        if unknown.any() and self.incident_level is not None:
            ref[unknown], scale[unknown] = self.incident_level(idx[unknown])
        return ref, scale

    def _table_level(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bank = self.banks[0]
        ref, scale = np.full(idx.size, np.nan), np.full(idx.size, np.nan)
        mon = ~bank.warming_up[idx]
        med, sigma = bank.baseline
        ref[mon], scale[mon] = med[idx[mon]], sigma[idx[mon]]
        if (~mon).any():
            rows, counts = bank.warm_samples(idx[~mon])
            enough = counts >= self.config.baseline.early_min
            if enough.any():
                med = np.nanmedian(rows[enough], axis=1)
                mad = np.nanmedian(np.abs(rows[enough] - med[:, None]), axis=1)
                part_ref, part_scale = np.full(counts.size, np.nan), np.full(counts.size, np.nan)
                part_ref[enough], part_scale[enough] = med, 1.4826 * mad
                ref[~mon], scale[~mon] = part_ref, part_scale
        return ref, scale

    def _rebase_streams(self, idx: np.ndarray, new_bpr: np.ndarray, new_cov: np.ndarray) -> None:
        """New workload on ``idx``: remember the current baseline with its workload (sizes,
        coverage), and either restore the baseline of the workload seen before it (a mix that
        ends, an A→B→A pattern: no blind warm-up) or start a new warm-up."""
        cfg = self.config
        med, scale = self.banks[0].baseline
        cur_med, cur_scale = med[idx].copy(), scale[idx].copy()
        cur_bpr, cur_cov = self.bytes_ref[idx].copy(), self.coverage_ref[idx].copy()
        pb, pc = self.prev_bpr[idx], self.prev_cov[idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            match = (np.isfinite(pb) & np.isfinite(self.prev_scale[idx])
                     & (np.abs(np.log(new_bpr / pb)) <= 0.5 * cfg.workload.mix_change)
                     & (np.abs(np.log(new_cov / pc)) <= 0.5 * cfg.workload.coverage_change))
        r_idx, r_med, r_scale = idx[match], self.prev_med[idx[match]], self.prev_scale[idx[match]]
        r_n = self.prev_n[idx[match]].copy()
        known = np.isfinite(cur_scale)
        self.old_bpr[idx], self.old_cov[idx], self.old_unknown[idx] = cur_bpr, cur_cov, ~known
        self.prev_bpr[idx[known]] = cur_bpr[known]
        self.prev_cov[idx[known]] = cur_cov[known]
        self.prev_med[idx[known]] = cur_med[known]
        self.prev_scale[idx[known]] = cur_scale[known]
        self.prev_n[idx[known]] = self.ss.n[idx[known]]
        stashed, _ = self.warm_stash.take(self, idx, new_bpr, new_cov)   # `warmup_stash`
        for bank in self.banks:
            bank.reset_streams(idx)
        self.ss.n[idx] = 0
        # an open early alarm's baseline came from a part of a warm-up: never a workload's
        # fixed baseline (`adopt_previous`); that workload, if it comes back, warms up again
        self.old_unknown[idx[self.early.release(idx)]] = False
        self.pool.clear(idx)
        self.carry_n[idx] = 0           # a new workload may have another noise
        self.rebase_warm[idx] = ~match
        if r_idx.size:
            self._adopt(r_idx, r_med, r_scale, np.maximum(r_n, 1))
            self.n_restored += int(r_idx.size)
        self.warm_stash.resume(self, stashed)
        self.bytes_ref[idx] = new_bpr
        self.coverage_ref[idx] = new_cov
        self.reporting_ref[idx] = self.reporting[idx]
        self.hist[:, idx] = np.nan
        self.n_rebased += int(idx.size)
        self.last_rebased = np.concatenate([self.last_rebased, idx])
