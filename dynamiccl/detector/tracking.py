"""Tracking of open incidents (a part of `dynamiccl.detector.fusion.Fusion`).

Each window an incident's streams are placed between their old baseline (0) and their degraded
level (1): ``recovery_windows`` windows in a row at ≤ ``recovery_fraction`` emit a ``recovery``
(and restore the old baselines at once); ``flap_transitions`` off→on transitions within
``flap_window_s`` emit one ``flapping`` change; an incident opened by rank evidence is tracked
by that evidence. An incident of one report back within ``transient_s`` of its onset (and half
of that of its report) closes as a transient (`Tracking._transient`): no ``recovery`` is emitted;
a `TransientEnd` goes to ``ended`` (for the retuner alone). A window in which most of an incident's streams are silent counts
neither way.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np
import polars as pl

from typing import TYPE_CHECKING

from .events import RegimeChange
from .regime_spread import regime_scale
from .softer_release import release_of_softer_step
from .warmup_trim import trim_warmups

if TYPE_CHECKING:
    from .incident import Incident
    from .streams import WindowStreams

__all__ = ["Tracking"]

MAX_CLOSED_PER_JOB = 16
# a deeper step starts from the tracked level: the window before it moved less than this share
# of the step (a degrading NIC's ramp moves a little every window: no step of its own)
ABRUPT = 0.5
OLD_SIDE = 0.5   # a window's position (0 old level, 1 degraded) below this is nearer the old level


class Tracking:
    """Mixin of `Fusion`: needs ``config``, ``table``, ``ranks``, ``active``, ``closed``,
    ``_n``, ``_window_s``, ``_release``, ``counters`` and ``ended``."""

    def _track(self, ws: WindowStreams, inc: Incident) -> RegimeChange | None:
        cfg, tab = self.config, self.table
        if inc.streams.size == 0:
            # every stream left it (re-baselined for a rank-set or workload change): nothing is
            # tracked any more, so its gauges and the retuner's choice for it end here
            self._close(inc, ws.t)
            now_s = float(ws.window_start + self._window_s)
            self.ended.append(inc.end(now_s, now_s, 1.0))
            self.counters["incidents_dissolved"] += 1
            return None
        cur = tab.current(inc.streams)
        if inc.rank_of is not None:
            return self._track_rank(ws, inc, cur)
        shift = inc.level - inc.base_med
        # an incident with latency streams is tracked by them: a step-rate stream
        # (`dynamiccl.detector.step_rate`) is a count whose window-to-window noise is several
        # times theirs; it tracks only an incident it alone opened
        step = tab.is_step[inc.streams]
        if step.any() and not step.all():
            cur, shift = np.where(step, np.nan, cur), np.where(step, np.nan, shift)
        ok = np.isfinite(cur) & np.isfinite(shift) & (np.abs(shift) > 0)
        if not ok.any() or 2 * int(ok.sum()) < int(np.count_nonzero(np.isfinite(shift) & (shift != 0))):
            # most of its streams silent (a pause, a size mix moving them to other buckets):
            # the few left (often the ones the workload change moved) are no evidence either way
            return None
        p = (cur[ok] - inc.base_med[ok]) / shift[ok]
        score = float(np.median(p))
        softer = self._softer(ws, inc, cur, ok, score)
        if softer is not None:
            return softer
        if score < OLD_SIDE:
            return self._off_side(ws, inc, cur, score)
        if not inc.on:
            inc.onsets.append(ws.t)
        inc.on = True
        inc.off_count = 0
        inc.off_scores.clear()
        step = self._deeper(ws, inc, cur, ok)
        if step is not None:
            return step
        upd = ok.copy()
        upd[ok] = p >= 0.5
        if inc.deeper_run == 0:      # a level moving away is judged by `_deeper`, not chased
            inc.level[upd] = 0.8 * inc.level[upd] + 0.2 * cur[upd]
        horizon = cfg.incidents.flap_window_s / self._window_s
        recent = [s for s in inc.onsets if ws.t - s <= horizon]
        if inc.flapping_id is None and inc.kind != "flapping" and len(recent) >= cfg.incidents.flap_transitions:
            return self._flapping(ws, inc)
        return None

    def _deeper(self, ws, inc: Incident, cur, ok) -> RegimeChange | None:
        """Rule: ``need`` windows in a row whose median move beyond the incident's level is
        >= ``step_ratio`` and >= ``confirm_z`` of its streams' old sigma are a deeper step
        (`dynamiccl.detector.steps`), reported from the incident's own tracking: the streams of an
        open incident re-learn for a whole warm-up (60 windows) before their own alarms can
        show a step, and test-bed throttles deepen 10-20 s after their onset."""
        cfg, tab = self.config, self.table
        if inc.kind == "flapping" or inc.flapping_id is not None:
            return None
        move = (cur[ok] - inc.level[ok]) * inc.direction
        z = move / regime_scale(cfg, tab, inc, ws.t, ok)     # the regime's own noise (`regime_spread`)
        m, before = float(np.median(move)), inc.last_move
        inc.last_move = m
        if not (m >= math.log(cfg.incidents.step_ratio) and float(np.median(z)) >= cfg.fusion.confirm_z):
            inc.deeper_run = 0
            return None
        if inc.deeper_run == 0:
            # still the onset unfolding (what follows within ``merge_s`` joins the incident: a
            # degrading NIC's 4 s ramp), or a ramp: no step of its own. An incident that has been
            # back at its old level since its report (``onsets``) is no onset unfolding: a ramp
            # never goes back, and a change that follows a short excursion is a step of its own
            unfolding = (ws.t - inc.detected_step) * self._window_s <= cfg.incidents.merge_s and not inc.onsets
            if unfolding or before >= ABRUPT * m:
                return None
            inc.deeper_from = ws.t
        inc.deeper_run += 1
        need = cfg.incidents.recovery_windows
        if self.table.cadence.paced(int(tab.job_code[inc.streams[0]]), self._window_s):
            need = 1     # a step-paced job's window with data holds a whole step
        if inc.deeper_run < need:
            return None
        inc.deeper_run = 0
        return self.steps.level_step(ws, self._window_s, inc, ok, cur, inc.deeper_from)

    def _softer(self, ws, inc: Incident, cur, ok, score: float) -> RegimeChange | None:
        """Rule (the mirror of `_deeper`): ``recovery_windows`` + 1 windows in a row whose median
        move back from the incident's level is >= ``step_ratio`` and >= ``confirm_z`` of its
        streams' old sigma, while the streams stay short of the old level (position above
        ``recovery_fraction``), are a softer step: a throttle eased, not released. Not within
        ``merge_s`` of the detection (an onset's overshoot settling) nor after a window that had
        already moved half as far (a gradual return: the recovery rule's), nor while the newest
        window still moved back by a step (``step_ratio``) from the one before: a softer step is
        a plateau, a release draining back is the recovery rule's (the run waits). Without it a softer
        step was absorbed: the windows sat between the two levels, neither on nor recovered."""
        cfg = self.config
        if inc.kind == "flapping" or inc.flapping_id is not None:
            return None
        back = (inc.level[ok] - cur[ok]) * inc.direction
        z = back / inc.base_scale[ok]
        m, before = float(np.median(back)), inc.last_back
        inc.last_back = m
        if not (m >= math.log(cfg.incidents.step_ratio) and float(np.median(z)) >= cfg.fusion.confirm_z
                and score > cfg.incidents.recovery_fraction):
            inc.softer_run = 0
            return None
        if inc.softer_run == 0:
            if (ws.t - inc.detected_step) * self._window_s <= cfg.incidents.merge_s or before >= ABRUPT * m:
                return None
            inc.softer_from = ws.t
        inc.softer_run += 1
        # a release passes through the levels between (a queue draining): the recovery rule
        # judges ``recovery_windows`` windows first, so a softer step must outlast it by one
        if inc.softer_run <= cfg.incidents.recovery_windows:
            return None
        if m - before >= math.log(cfg.incidents.step_ratio):
            return None          # still moving back by a step a window: a descent, not yet a plateau
        inc.softer_run = 0
        return self.steps.level_step(ws, self._window_s, inc, ok, cur, inc.softer_from)

    def _off_side(self, ws, inc: Incident, cur, score: float) -> RegimeChange | None:
        """A window nearer the old level than the degraded one. Rule: ``need`` such windows in a
        row whose mean position (each clipped at 0) is within ``recovery_fraction`` of the old
        level are the recovery. Judging the run's mean, not each window, keeps one noisy
        window just above the fraction (a release's queue drain, a TCP ramp: 0.3-0.5 of the
        shift) from restarting the count; a window on the degraded side still does."""
        cfg, tab = self.config, self.table
        inc.off_scores.append(max(score, 0.0))
        inc.last_move, inc.deeper_run = 0.0, 0
        inc.off_count = len(inc.off_scores)
        if score <= cfg.incidents.recovery_fraction:
            inc.on = False
        need = cfg.incidents.recovery_windows
        if self.table.cadence.paced(int(tab.job_code[inc.streams[0]]), self._window_s):
            # a step-paced job's window with data holds a whole step (the windows between
            # are empty): one is as much evidence as a dense job's ``recovery_windows``
            need = 1
        if inc.kind == "flapping" or inc.flapping_id is not None:
            # a flapping link is back only after a quiet spell longer than its off phases
            need = max(need, int(math.ceil(0.5 * cfg.incidents.flap_window_s / self._window_s)))
        recent = list(inc.off_scores)[-need:]
        if len(recent) >= need and sum(recent) / need <= cfg.incidents.recovery_fraction:
            return self._recover(ws, inc, cur)
        return None

    def _track_rank(self, ws, inc: Incident, cur) -> RegimeChange | None:
        """A change opened by rank evidence (a small slowdown, within a few sigma of the
        latency noise) is tracked by the same evidence: it recovers after ``recovery_windows``
        windows in which its rank is no longer the dominant shortest."""
        cfg = self.config
        if not self.ranks.frames or self.ranks.frames[-1][0] != ws.t:
            return None
        f = self.ranks.frames[-1][1]
        comm, rank = inc.rank_of
        sel = f.filter((pl.col("job_id") == inc.job) & (pl.col("comm_hash") == comm))
        total = int(sel.get_column("shortest_count").sum() or 0) if sel.height else 0
        if total < cfg.straggler.min_instances:
            return None
        mine = int(sel.filter(pl.col("rank") == rank).get_column("shortest_count").sum() or 0)
        if mine >= 0.5 * cfg.straggler.share * total:
            inc.off_count = 0
            return None
        inc.off_count += 1
        if inc.off_count >= cfg.incidents.recovery_windows:
            return self._recover(ws, inc, cur)
        return None

    def _flapping(self, ws, inc: Incident) -> RegimeChange:
        n = self._n.get(inc.job, 0) + 1
        self._n[inc.job] = n
        cid = f"rc-{inc.job}-{n}"
        inc.flapping_id = cid
        base = inc.change
        change = RegimeChange(
            id=cid, kind="flapping", job_id=inc.job, start_s=base.start_s,
            detected_s=float(ws.window_start + self._window_s), magnitude=base.magnitude, comms=base.comms,
            comm_names=base.comm_names, funcs=base.funcs, size_buckets=base.size_buckets, ranks=base.ranks,
            hosts=base.hosts, evidence={"refines": inc.id, "on_transitions": len(inc.onsets),
                                        "n_streams": int(inc.streams.size)})
        return change

    def _recover(self, ws, inc: Incident, cur) -> RegimeChange | None:
        tab = self.table
        ok = np.isfinite(cur)
        with np.errstate(invalid="ignore"):
            mag = round(float(np.exp(np.median(cur[ok] - inc.level[ok]))) if ok.any() else 1.0, 4)
        start_s = float(tab.window_start_of(ws.t - inc.off_count + 1))
        closed_s = float(ws.window_start + self._window_s)
        base = inc.change
        self._restore(inc)
        self._close(inc, ws.t)
        transient = self._transient(inc, closed_s)
        if transient or release_of_softer_step(self.config, inc, closed_s):
            # a transient (no regime of its own), or the release its softer step already reported
            inc.transient = transient
            self.counters["transients" if transient else "softer_releases"] += 1
            self.ended.append(inc.end(start_s, closed_s, mag))
            return None
        n = self._n.get(inc.job, 0) + 1
        self._n[inc.job] = n
        return RegimeChange(
            id=f"rc-{inc.job}-{n}", kind="recovery", job_id=inc.job, start_s=start_s, detected_s=closed_s,
            magnitude=mag, comms=base.comms, comm_names=base.comm_names, funcs=base.funcs,
            size_buckets=base.size_buckets, ranks=base.ranks, hosts=base.hosts, recovers=base.id,
            evidence={"ends": inc.ids, "n_streams": int(inc.streams.size)})

    def _transient(self, inc: Incident, closed_s: float) -> bool:
        """Rule: an incident of one report (no step, no flapping) that is back less than
        ``transient_s`` after its onset and less than half of it after its report was a
        transient excursion, not a regime: its closing is no regime change of its own. Both
        clocks: a late report of a regime that lasted is followed closely by its real end (the
        onset says it lasted), and a report made early in a regime of ``transient_s`` leaves
        more than half of it before the end (the report says it was acted on)."""
        limit = self.config.incidents.transient_s
        if limit <= 0 or inc.step_ids or inc.kind == "flapping" or inc.flapping_id is not None:
            return False
        return closed_s - inc.change.start_s < limit and closed_s - inc.change.detected_s < 0.5 * limit

    def _restore(self, inc: Incident) -> None:
        tab = self.table
        tab.restore_baseline(inc.streams, inc.base_med, inc.base_scale)
        # streams of the same communicators that learned their baseline during the incident
        # (they were warming up at its onset) learned the degraded level: learn again
        comms = np.unique(tab.comm_hash[inc.streams])
        same = np.flatnonzero(tab.active & np.isin(tab.comm_hash, comms) & (tab.job_code == tab.jobs.get(inc.job, -2))
                              & (tab.monitor_since > inc.onset_step))
        same = same[~np.isin(same, inc.streams)]
        if same.size:
            tab.rebase(same)
        if self.config.baseline.trim_warmup:
            self.counters["warmups_trimmed"] += trim_warmups(tab, inc)

    def _deactivate(self, inc: Incident) -> None:
        """``inc`` is no longer active; its streams are free."""
        lst = self.active.get(inc.job, [])
        if inc in lst:
            lst.remove(inc)
        if not lst:
            self.active.pop(inc.job, None)
        self._release(inc)

    def _close(self, inc: Incident, step: int) -> None:
        self._deactivate(inc)
        inc.closed_step = step
        self.closed.setdefault(inc.job, deque(maxlen=MAX_CLOSED_PER_JOB)).append(inc)


