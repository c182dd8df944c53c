"""The rank trigger: a straggler seen in the per-rank shares before any latency alarm."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from .straggler import find_stragglers

if TYPE_CHECKING:
    from .streams import WindowStreams

__all__ = ["RankTrigger"]


class RankTrigger:
    """Mixin of `Fusion` (uses its incidents, ``_refine_onset`` and ``_create``)."""

    def _rank_trigger(self, ws: WindowStreams, ae) -> list:
        """A straggler without a latency alarm yet: in a communicator one rank was the strict
        shortest (its peers wait for it) in most instances of the last two windows, far beyond
        chance (binomial z ≥ ``straggler_trigger_z``), and not before; the communicator's
        latency rose (≥ ``min_ratio``, median z ≥ 1). Rank shares are overwhelming long before
        a small slowdown (5 % on a 64-rank job) is significant in the latency streams."""
        out = []
        # communicators are judged in turn: a merge into an incident claims its streams
        # (`stream_incident`) before the next communicator's streams are gathered
        for job, comm, total, top, n in self._dominated_comms(ws):
            found = self._trigger_comm(ws, ae, job, comm, total, top, n)
            if found is not None:
                out.append(found)
        return out

    def _dominated_comms(self, ws: WindowStreams) -> list:
        """Rule: (job, comm, total, top, n) of the communicators of this window's rank frame
        where one of ≥ 2 ranks was the shortest in ≥ ``straggler_share`` of ≥ ``min_instances``
        instances; none when the trigger is off or the frame is not this window's."""
        cfg = self.config
        if cfg.straggler.trigger_z <= 0 or not self.ranks.frames or self.ranks.frames[-1][0] != ws.t:
            return []
        f = self.ranks.frames[-1][1]
        if "shortest_count" not in f.columns or f.height == 0:
            return []
        agg = f.group_by("job_id", "comm_hash").agg(pl.col("shortest_count").sum().alias("total"),
                                                      pl.col("shortest_count").max().alias("top"),
                                                      pl.len().alias("n"))
        agg = agg.filter((pl.col("n") >= 2) & (pl.col("total") >= cfg.straggler.min_instances)
                         & (pl.col("top") >= cfg.straggler.share * pl.col("total")))
        return list(agg.iter_rows()) if agg.height else []

    def _trigger_comm(self, ws: WindowStreams, ae, job, comm, total, top, n):
        """One dominated communicator → a new (incident, change), or None (not significant,
        already covered, no latency rise, no new straggler, or merged into a live incident)."""
        cfg = self.config
        p0 = 1.0 / n
        # a cheap pre-check on the window's counts (half the bar): the full test needs the history
        if (top - total * p0) / math.sqrt(total * p0 * (1.0 - p0)) < 0.5 * cfg.straggler.trigger_z:
            return None
        if self._comm_degrading(job, comm):
            return None
        risen = self._risen_streams(ws, job, comm)
        if risen is None:
            return None
        idx, med, scale, level = risen
        cands = find_stragglers(self.ranks, job, {int(comm)}, onset_step=ws.t - 1,
                                share=cfg.straggler.share, min_instances=2 * cfg.straggler.min_instances,
                                later_alone=False)
        best = self._new_straggler(cands, n)
        if best is None:
            return None
        if self._merge_same_straggler(ws, job, best, idx, med, scale, level):
            return None
        onset = self._refine_onset(idx, med, level, ws.t - 2, ws.t)
        ae_score, ae_thr = ae.get(job, (float("nan"), float("inf")))
        self.counters["rank_triggers"] += 1
        inc, change = self._create(ws, job, 1, idx, med, scale, level, onset, ae_score, ae_thr,
                                   [best] + [c for c in cands if c is not best])
        change.evidence["trigger"] = "ranks"
        inc.rank_of = (best.comm_hash, best.rank)
        return inc, change

    def _comm_degrading(self, job, comm) -> bool:
        """Rule: a live degradation of the job already covers this communicator (no second change)."""
        tab = self.table
        return any(inc.direction > 0 and int(comm) in set(tab.comm_hash[inc.streams].tolist())
                   for inc in self.active.get(job, []))

    def _risen_streams(self, ws: WindowStreams, job, comm):
        """Rule: the communicator's latency streams in no incident rose (max log-ratio ≥
        log ``min_ratio``, median z ≥ 1) → (idx, med, scale, level) of those with a baseline and
        a level (current, else the last recent); None otherwise. A straggler that slows nothing
        is no regime change."""
        cfg, tab = self.config, self.table
        code = tab.jobs.get(job, -2)
        n_s = tab.n
        idx = np.flatnonzero(tab.active[:n_s] & (tab.job_code[:n_s] == code) & (tab.comm_hash[:n_s] == comm)
                             & ~tab.is_step[:n_s])
        idx = idx[~np.isin(idx, np.fromiter(self.stream_incident, np.int64, len(self.stream_incident)))]
        if idx.size == 0:
            return None
        med, scale = tab.baseline(idx)
        level = tab.current(idx)
        level = np.where(np.isfinite(level), level, tab.recent(idx, ws.t - 1))
        ok = np.isfinite(med) & np.isfinite(level) & (scale > 0)
        if not ok.any():
            return None
        idx, med, scale, level = idx[ok], med[ok], scale[ok], level[ok]
        lr = level - med
        if not (np.max(lr) >= math.log(cfg.fusion.min_ratio) and np.median(lr / scale) >= 1.0):
            return None
        return idx, med, scale, level

    def _new_straggler(self, cands: list, n: int):
        """Rule: the first candidate that was not dominant before (known share before below half
        ``straggler_share``) and whose share now is ≥ ``straggler_trigger_z`` binomial sigmas
        beyond chance (1/n); None if none."""
        cfg = self.config
        for c in cands:
            if not (c.share_before == c.share_before and c.share_before < 0.5 * cfg.straggler.share):
                continue                      # dominant before, or nothing known before
            p0 = 1.0 / n
            z = (c.share - p0) * c.instances / math.sqrt(c.instances * p0 * (1.0 - p0))
            if z >= cfg.straggler.trigger_z:
                return c
        return None

    def _merge_same_straggler(self, ws: WindowStreams, job, best, idx, med, scale, level) -> bool:
        """Rule: the same straggler seen in another of its communicators, or just after another
        change of this job (within ``merge_s``), is part of that change: its streams join the
        first such incident (counter ``alarms_merged``). True when merged."""
        cfg = self.config
        same = [inc for inc in self.active.get(job, []) if inc.direction > 0 and (
            (ws.t - inc.detected_step) * self._window_s <= cfg.incidents.merge_s
            or (inc.kind == "straggler" and best.host in inc.change.hosts))]
        if not same:
            return False
        same[0].add(idx, med, scale, level)
        for i in idx.tolist():
            self.stream_incident[i] = same[0]
        self.counters["alarms_merged"] += len(idx)
        return True
