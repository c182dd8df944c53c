"""Read-only questions the fusion stage asks of the stream table and the rank history: a
stream's peak, a job's time share, whether only network streams moved, the onset, the straggler
candidates, a mixed window, the size response and the hosts. No state of their own."""
from __future__ import annotations

import math

import numpy as np

from .classify import classify_size_response
from .straggler import STRAGGLER_REL_Z, comm_hosts, find_stragglers, has_rank_evidence

__all__ = ["FusionQueries"]


class FusionQueries:
    """Mixin of `Fusion` (uses its ``config``, ``table`` and ``ranks``)."""

    def _peak(self, idx, med, direction, since_step: int) -> np.ndarray:
        """Per stream, its value farthest from ``med`` in ``direction`` from ``since_step`` to
        now (NaN without values)."""
        tab = self.table
        H = self.config.streams.history
        steps = np.arange(max(since_step, tab.t - H + 1), tab.t + 1) % H
        vals = tab.hist[steps][:, idx]
        dev = np.where(np.isfinite(vals), (vals - med) * direction, -np.inf)
        j = np.argmax(dev, axis=0)
        out = vals[j, np.arange(idx.size)]
        return np.where(np.isfinite(dev.max(axis=0, initial=-np.inf)), out, np.nan)

    def _time_share(self, job, idx) -> float:
        """Share of the job's collective time this window (instances x latency) spent in
        streams ``idx``."""
        tab = self.table
        code = tab.jobs.get(job, -2)
        n = tab.n
        # (a step-rate stream's instances x seconds per instance is the window: no collective time)
        allj = np.flatnonzero(tab.active[:n] & (tab.job_code[:n] == code) & ~tab.is_step[:n])
        with np.errstate(invalid="ignore", over="ignore"):
            w_all = tab.instances[allj] * np.exp(tab.current(allj))
            mine = idx[(tab.job_code[idx] == code) & ~tab.is_step[idx]]
            w_mine = tab.instances[mine] * np.exp(tab.current(mine))
        tot = float(np.nansum(w_all))
        return float(np.nansum(w_mine)) / tot if tot > 0 else 1.0

    def _network_only(self, job, idx, direction) -> bool:
        """All of ``idx`` are multi-node streams and the job's monitored intra-node streams
        (≥ ``corroborate`` of them, with a value this window) sit within ``quiet_z`` of their
        baseline (median, in the alarm's direction)."""
        tab, cfg = self.table, self.config
        if cfg.fusion.quiet_z <= 0 or idx.size == 0 or not (tab.nnodes[idx] > 1).all():
            return False
        code = tab.jobs.get(job, -2)
        n = tab.n
        ref = np.flatnonzero(tab.active[:n] & (tab.job_code[:n] == code) & (tab.nnodes[:n] == 1) & ~tab.is_step[:n])
        if ref.size < cfg.fusion.corroborate:
            return False
        med, scale = tab.baseline(ref)
        cur = tab.current(ref)
        ok = np.isfinite(cur) & np.isfinite(med) & (scale > 0)
        if ok.sum() < cfg.fusion.corroborate:
            return False
        z = (cur[ok] - med[ok]) / scale[ok] * direction
        return float(np.median(z)) < cfg.fusion.quiet_z

    def _refine_onset(self, idx, med, level, cusum_step: int, t: int) -> int:
        """The CUSUM's last reset point, moved forward to the first window of the excursion
        already half-way to the new level (noise can start an excursion early)."""
        tab = self.table
        H = self.config.streams.history
        lo = max(cusum_step, t - H + 1)
        if lo >= t:
            return max(cusum_step, lo)
        j = int(np.nanargmax(np.abs(np.nan_to_num(level - med)))) if np.isfinite(level - med).any() else 0
        half = med[j] + 0.5 * (level[j] - med[j])
        sign = 1.0 if level[j] >= med[j] else -1.0
        for step in range(lo, t + 1):
            v = tab.hist[step % H, idx[j]]
            if np.isfinite(v) and (v - half) * sign >= 0:
                return step
        return lo

    def _stragglers(self, job, idx, onset_step, *, rel: bool = False):
        """``rel``: also per-rank duration ratios (`dynamiccl.detector.straggler`), for classifying a change
        the latency streams already justify (one rank stalling for one window is no event)."""
        comms = {int(c) for c in self.table.comm_hash[idx].tolist()}
        return find_stragglers(self.ranks, job, comms, onset_step=onset_step,
                               share=self.config.straggler.share,
                               min_instances=self.config.straggler.min_instances,
                               rel_z=STRAGGLER_REL_Z if rel else None)

    def _mixed(self, idx, med, level) -> bool:
        """This window mixes two regimes: over the streams, the p90/p50 spread widened by more
        than the p50 moved (the p90 at least twice as far from the old level as the p50)."""
        tab = self.table
        with np.errstate(invalid="ignore"):
            widened = tab.spread[idx] - tab.spread_prev[idx]
            moved = level - med
        ok = np.isfinite(widened) & np.isfinite(moved) & np.isfinite(tab.current(idx))
        return bool(ok.any()) and float(np.median(widened[ok])) > max(float(np.median(moved[ok])), 0.0)

    def _forming(self, job, idx, onset_step) -> bool:
        comms = {int(c) for c in self.table.comm_hash[idx].tolist()}
        return has_rank_evidence(self.ranks, job, comms, onset_step)

    def _size_response(self, job, idx, med, scale, onset_step):
        """Classify bandwidth vs latency over the fired streams plus the job's other monitored
        multi-node streams (an unchanged small-message stream is evidence too)."""
        tab = self.table
        # a step-rate stream has no message size: it says how much, not bandwidth or latency;
        # alone it is a throughput loss (``bandwidth``)
        lat = ~tab.is_step[idx]
        if not lat.any():
            return "bandwidth", {"step_rate": True}
        idx, med, scale = idx[lat], med[lat], scale[lat]
        ids, meds, scales = [idx], [med], [scale]
        if (tab.nnodes[idx] > 1).any():
            # a network event: compare sizes on multi-node streams only (intra-node streams
            # only move through arrival coupling)
            multi = tab.nnodes[idx] > 1
            ids, meds, scales = [idx[multi]], [med[multi]], [scale[multi]]
            others = np.flatnonzero(tab.active & (tab.job_code == tab.jobs.get(job, -2)) & (tab.nnodes > 1))
            others = others[~np.isin(others, idx) & ~tab.is_step[others]]
            if others.size:
                om, osc = tab.baseline(others)
                ok = np.isfinite(osc)
                ids.append(others[ok])
                meds.append(om[ok])
                scales.append(osc[ok])
        all_idx = np.concatenate(ids)
        all_med = np.concatenate(meds)
        all_scale = np.concatenate(scales)
        lvl = tab.recent(all_idx, onset_step)
        n_post = max(1, min(self.table.t - onset_step + 1, self.config.streams.history))
        sigma = all_scale * math.sqrt(1.0 / n_post + 1.0 / self.config.baseline.warmup)
        # sizes are compared within one collective of one communicator (same ranks, links and
        # algorithm family); across collectives only when no communicator has two sizes
        group = [f"{c:x}:{f}" for c, f in zip(tab.comm_hash[all_idx].tolist(), tab.func[all_idx].tolist())]
        return classify_size_response(tab.bytes_per_record[all_idx], lvl - all_med, sigma, group=group)

    def _hosts(self, job, comms_h) -> list[str]:
        per = comm_hosts(self.ranks, job, comms_h)
        sets = [per[c] for c in comms_h if c in per]
        if not sets:
            return []
        common = set.intersection(*sets)
        return sorted(common) if common else sorted(set.union(*sets))
