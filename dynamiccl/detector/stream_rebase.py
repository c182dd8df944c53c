"""The stream table's workload re-baselining: a stream whose sizes, configuration or rank set
changed gets a new warm-up, or the baseline of the workload it had before (an A -> B -> A mix
costs no blind warm-up)."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["StreamRebase", "LOST_RANK_SHIFT"]

# a stream whose latency moved this much (|log|, 1.5x) in the window its rank set changed is
# slowed, not re-made: a throttled or bulk-loaded rank's records miss the window (test bed:
# 2-4 rank jobs lost the slowed rank from 2-3 successive windows at 12 of 26 dev changes that
# re-based instead of alarming); a rank that vanishes or whose clock jumps leaves the others'
# latency where it was
LOST_RANK_SHIFT = math.log(1.5)


class StreamRebase:
    """Mixin of `StreamTable`."""

    def rebase(self, idx) -> None:
        """Treat streams ``idx`` as changed workload: new size reference, new warm-up."""
        idx = np.atleast_1d(np.asarray(idx, np.int64))
        self._rebase_streams(idx, self.bytes_per_record[idx], self.coverage[idx])

    def _shifted(self, idx: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Streams ``idx`` whose value ``x`` (log latency) is >= `LOST_RANK_SHIFT` from their
        level: the monitored baseline, or the median of a warm-up with ``early_min`` samples
        (False where neither is known)."""
        bank = self.banks[0]
        ref = np.full(idx.size, np.nan)
        mon = ~bank.warming_up[idx]
        ref[mon] = bank.baseline[0][idx[mon]]
        if (~mon).any():
            rows, counts = bank.warm_samples(idx[~mon])
            enough = counts >= self.config.baseline.early_min
            if enough.any():
                part = np.full(counts.size, np.nan)
                part[enough] = np.nanmedian(rows[enough], axis=1)
                ref[~mon] = part
        with np.errstate(invalid="ignore"):
            return np.abs(x - ref) >= LOST_RANK_SHIFT

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
