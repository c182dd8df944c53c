"""The gates a new alarm group passes before it becomes a regime change, in order:

1. ``recovery_tail`` — the far side of a recovery seen late by a stream: absorbed;
   ``recovery_drain`` — a recovered incident's streams still draining (`fusion_drain`): absorbed;
2. ``merge`` — same job and direction as an active incident, near in time, on a communicator
   it covers or with a similar shift: joins it;
3. ``small_shift`` — below ``min_ratio``: no regime change (or waits, ``small_shift_wait``);
4. ``workload`` — explained by a change of message sizes / ranks, or a side effect of one;
   ``onset_level`` — an unconfirmed alarm whose streams' level since its onset is below the
   confirm bar (a spike ending a slow accumulation) waits for confirmation (`onset_level`);
   ``post_recovery_hold`` — a degradation within ``flap_window_s`` of the job's recovery needs
   one more confirming window (`post_recovery`);
5. ``evidence`` — enough streams with whole windows, a confirmation, network-only or a
   straggler; else the group waits for confirmation;
6. ``wait`` — judged one window later (``rank_waits``, ``rank_rechecks``, ``onset_waits``).

Each gate is one method returning its verdict (the counter it incremented, or None to pass).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import onset_level
from .adopt_improvement import adopt
from .fusion_drain import drained
from .preconfirm import preconfirmed
from .incident import MAX_PENDING, RECHECK_LATENCY_SHARE, Alarms, Pending
from .stream_rebase import LOST_RANK_SHIFT

__all__ = ["FusionGates", "AlarmGroup"]


@dataclass
class AlarmGroup(Alarms):
    """One (job, direction) group of new alarms, assembled for the gates."""
    level: np.ndarray
    onset_step: int
    confirmed: bool
    peak: bool

    @property
    def lr(self) -> np.ndarray:
        return (self.level - self.med) * self.direction

    def pending(self, t: int, *, peak: bool = False) -> Pending:
        return Pending(self.job, self.direction, self.idx, self.med, self.scale, self.start, t, peak=peak)


class FusionGates:
    """Mixin of `Fusion`: ``_judge`` runs the gates on one group."""

    def _judge(self, ws, job, direction, g, ae):
        a = self._assemble(ws, job, direction, g)
        for gate in (self._gate_recovery_tail, self._gate_recovery_drain, self._gate_merge, self._gate_small_shift, self._gate_workload,
                     self._gate_onset_level, self._gate_post_recovery):
            if gate(ws, a) is not None:
                return None, None
        ae_score, ae_thr = ae.get(job, (float("nan"), float("inf")))
        if ae_score > ae_thr:
            self.counters["autoencoder_flags"] += 1
        ok, stragglers, big = self._gate_evidence(ws, a)
        if not ok:
            return None, None
        wait, stragglers = self._gate_wait(ws, a, big, stragglers)
        if wait is not None:
            return None, None
        inc, change = self._create(ws, job, direction, a.idx, a.med, a.scale, a.level, a.onset_step, ae_score,
                                   ae_thr, stragglers)
        if direction < 0 and self.config.incidents.adopt_improvement:
            adopt(self, inc)      # a faster job's new normal (`adopt_improvement`)
        return inc, change

    def _assemble(self, ws, job, direction, g) -> AlarmGroup:
        cfg, tab = self.config, self.table
        idx, med = np.concatenate(g["idx"]), np.concatenate(g["med"])
        scale, start = np.concatenate(g["scale"]), np.concatenate(g["start"])
        cusum_step = int(start.min())
        # the degraded level: this window's value (the excursion may start with noise windows)
        level = tab.current(idx)
        level = np.where(np.isfinite(level), level, tab.recent(idx, cusum_step))
        if g.get("peak"):
            # a big alarm held back one window for the straggler decision (`rank_waits`): a
            # bursty regime (incast, a flapping link) may be in an off phase by now; judge it
            # on the farthest window since its alarm, as it would have been judged at once
            peak = self._peak(idx, med, direction, ws.t - cfg.fusion.confirm_windows)
            level = np.where(np.isfinite(peak) & ((peak - med) * direction > (level - med) * direction),
                             peak, level)
        onset_step = self._refine_onset(idx, med, level, cusum_step, ws.t)
        return AlarmGroup(job, direction, idx, med, scale, start, level, onset_step,
                          bool(g["confirmed"]), bool(g.get("peak")))

    # ------------------------------------------------------------------ gates
    def _gate_recovery_tail(self, ws, a: AlarmGroup) -> str | None:
        """The far side of a recovery seen late by a stream: part of that recovery."""
        tab = self.table
        comms_new = set(tab.comm_hash[a.idx].tolist())
        for old in self.closed.get(a.job, ()):
            if (old.direction == -a.direction and old.closed_step is not None
                    and (ws.t - old.closed_step) * self._window_s <= self.config.incidents.merge_s
                    and comms_new & set(tab.comm_hash[old.streams].tolist())):
                self.counters["alarms_absorbed"] += len(a.idx)
                tab.rebase(a.idx)
                return "alarms_absorbed"
        return None

    def _gate_recovery_drain(self, ws, a: AlarmGroup) -> str | None:
        return "recovery_drains" if drained(self, ws, a) else None

    def _gate_merge(self, ws, a: AlarmGroup) -> str | None:
        """Joins an active incident of the same job and direction: near in time, on a
        communicator it covers (one incident per communicator and direction: later streams of a
        degraded comm are the event spreading), or a wave of alarms with about the same shift."""
        cfg, tab = self.config, self.table
        comms_new = set(tab.comm_hash[a.idx].tolist())
        for inc in self.active.get(a.job, []):
            if inc.direction != a.direction:
                continue
            near = min(ws.t - inc.detected_step, abs(a.onset_step - inc.onset_step)) * self._window_s
            shared = bool(comms_new & set(tab.comm_hash[inc.streams].tolist()))
            with np.errstate(invalid="ignore"):
                inc_lr = float(np.nanmedian(inc.level - inc.base_med)) if inc.streams.size else float("nan")
                new_lr = float(np.nanmedian(a.level - a.med))
            similar = (math.isfinite(inc_lr) and math.isfinite(new_lr) and inc_lr != 0.0
                       and abs(new_lr - inc_lr) <= 0.5 * abs(inc_lr)
                       and (ws.t - inc.onset_step) * self._window_s <= cfg.incidents.merge_similar_s)
            if near <= cfg.incidents.merge_s or shared or similar:
                inc.add(a.idx, a.med, a.scale, a.level)
                for i in a.idx.tolist():
                    self.stream_incident[i] = inc
                self.counters["alarms_merged"] += len(a.idx)
                return "alarms_merged"
        return None

    def _gate_small_shift(self, ws, a: AlarmGroup) -> str | None:
        """Shifts below ``min_ratio`` are not regime changes. With ``small_shift_wait`` an
        unconfirmed one waits: its alarm window may still be half the old regime."""
        cfg = self.config
        if np.nanmax(np.abs(a.lr), initial=0.0) >= math.log(cfg.fusion.min_ratio):
            return None
        if cfg.fusion.small_shift_wait and not a.confirmed and len(self.pending) < MAX_PENDING:
            self.counters["small_waits"] += 1
            self.pending.append(a.pending(ws.t))
            return "small_waits"
        self.counters["small_shifts"] += 1
        return "small_shifts"

    def _gate_workload(self, ws, a: AlarmGroup) -> str | None:
        """A latency change explained by a change in message sizes (or in the ranks reporting)
        is a workload change; modest alarms in the few windows after a workload change elsewhere
        in the job are its side effects (arrival coupling)."""
        cfg, tab, idx = self.config, self.table, a.idx
        lr = a.lr
        with np.errstate(invalid="ignore", divide="ignore"):
            moved = np.abs(np.log(tab.bytes_per_record[idx] / tab.bytes_ref[idx]))
            covm = np.abs(np.log(tab.coverage[idx] / tab.coverage_ref[idx]))
        explained = (np.isfinite(moved) & (moved >= 0.5 * np.abs(lr)) & (moved >= 0.01)) | (
            np.isfinite(covm) & (covm >= 0.5 * cfg.workload.coverage_change) & tab.rank_set_changed[idx]
            & (np.abs(lr) < LOST_RANK_SHIFT))   # a big shift: a slowed rank's records missed the window
        own = explained.sum() * 2 > len(idx)
        recent_rebase = (ws.t - self._rebased_at.get(a.job, -(1 << 40)) <= cfg.workload.settle_windows
                         and np.nanmax(np.abs(lr), initial=0.0) < math.log(cfg.workload.settle_ratio))
        if not (own or recent_rebase):
            return None
        self.counters["workload_changes"] += 1
        tab.rebase(idx)
        if own or cfg.workload.settle_chain:
            # a size change of its own; or (``workload_settle_chain``) a side effect, which
            # extends the settling time (one workload change can then blind every stream in turn)
            self._rebased_at[a.job] = ws.t
        return "workload_changes"

    def _gate_onset_level(self, ws, a: AlarmGroup) -> str | None:
        """Judged on the windows since the onset, not the last one: held, not dropped."""
        if not onset_level.holds(self.config, self.table, a, ws.t):
            return None
        if len(self.pending) < MAX_PENDING:
            self.pending.append(a.pending(ws.t))
        else:
            self.counters["pending_dropped"] += 1
            self.table.restore_baseline(a.idx, a.med, a.scale)
        self.counters["onset_level_holds"] += 1
        return "onset_level_holds"

    def _gate_post_recovery(self, ws, a: AlarmGroup) -> str | None:
        """Soon after the job's recovery: held once, opened on a later confirming window."""
        if not self.post_recovery.holds(ws, a):
            return None
        if len(self.pending) < MAX_PENDING:
            # judged, once confirmed again, on its farthest window since the alarm (as it would
            # have been judged at once: `_assemble`'s peak), not on the later, lower one
            self.pending.append(a.pending(ws.t, peak=True))
        else:
            self.counters["pending_dropped"] += 1
            self.table.restore_baseline(a.idx, a.med, a.scale)
        self.counters["post_recovery_holds"] += 1
        return "post_recovery_holds"

    def _gate_evidence(self, ws, a: AlarmGroup):
        """Enough evidence to open an incident now: confirmed, or a big shift on
        ``corroborate`` streams with whole windows, or network streams only, or a straggler.
        Returns (ok, stragglers, big); a group without evidence waits for confirmation."""
        cfg, tab, idx = self.config, self.table, a.idx
        stragglers = None
        # partial windows (a pause starting, the job's last) and the first windows after a gap
        # are no evidence on their own: their value waits for the next window. A confirmed
        # alarm has had that window: its gap windows count (a step-paced job that a throttle
        # slows leaves a gap before every window, and its alarms were never evidence)
        with np.errstate(invalid="ignore", divide="ignore"):
            partial = (tab.instances[idx] < cfg.fusion.partial_window * tab.instances_ref[idx]) | (
                (ws.t - tab.gap_step[idx] <= 1) & (not a.confirmed))
        full = int((~partial).sum())
        # a one-window job-wide hiccup (GC, OS jitter) moves many streams by a few per cent at
        # once: below ``persist_ratio`` a shift must persist one more window, however many
        # streams (or the autoencoder, which flags hiccups as readily as onsets) agree
        big = np.nanmax(np.abs(a.lr), initial=0.0) >= math.log(cfg.fusion.persist_ratio)
        ok = (a.confirmed and full >= 1) or (big and full >= cfg.fusion.corroborate)
        if (not ok and full >= 1 and not self._recovering(a)
                and preconfirmed(cfg, tab, idx, a.med, a.scale, a.start, a.direction, ws.t, self._window_s)):
            ok = True       # its window and the one before already beyond the confirm bar (`preconfirm`)
            self.counters["preconfirmed"] += 1
        if not ok and full >= cfg.fusion.corroborate and self._network_only(a.job, idx[~partial], a.direction):
            # a job-wide hiccup moves the intra-node streams too; a network event leaves them alone
            ok = True
            self.counters["network_only"] += 1
        if not ok and a.direction > 0 and full >= 1:
            stragglers = self._stragglers(a.job, idx, a.onset_step)
            ok = bool(stragglers)
        if not ok:
            if len(self.pending) < MAX_PENDING:
                self.pending.append(a.pending(ws.t))
            else:
                self.counters["pending_dropped"] += 1
                tab.restore_baseline(idx, a.med, a.scale)
        return ok, stragglers, big

    def _recovering(self, a: AlarmGroup) -> bool:
        """The job has an active incident of the other direction: an alarm now may be its release,
        which tracking judges (and the recovery_tail gate absorbs once it closed)."""
        return any(inc.direction == -a.direction for inc in self.active.get(a.job, []))

    def _wait_is_a_step(self, a: AlarmGroup) -> bool:
        """A degradation of a step-paced job that passed the evidence gate is not held for its
        kind: the waits below judge the kind (straggler or not) again on the next window because
        a dense job's alarm window may straddle the onset, partly the old regime. A step-paced
        job's window holds one step's burst of collectives, before or after the onset, and its
        next window is the next step (2-10 s away, `dynamiccl.detector.sparse.JobCadence`), past
        a 5 s report. A dense job's next window is 1 s away: it waits."""
        return self.table.cadence.paced(int(self.table.job_code[a.idx[0]]), self._window_s)

    def _gate_wait(self, ws, a: AlarmGroup, big: bool, stragglers):
        """A degradation seen in the window holding its onset is judged one window later (as a
        pending group with ``peak``), with the counter that says why. Returns (verdict, stragglers)."""
        cfg = self.config
        if not (a.direction > 0 and ws.t <= a.onset_step and len(self.pending) < MAX_PENDING):
            return None, stragglers
        if self._wait_is_a_step(a):
            self.counters["paced_kind_now"] += 1
            return None, stragglers
        wait = None
        if big and not a.confirmed:
            # partly the old regime: without a straggler there yet, the kind is decided one
            # window later (`straggler.has_rank_evidence`)
            stragglers = stragglers or self._stragglers(a.job, a.idx, a.onset_step, rel=True)
            if not stragglers and self._forming(a.job, a.idx, a.onset_step):
                wait = "rank_waits"
        if wait is None and cfg.straggler.recheck and not a.peak:
            stragglers = stragglers or self._stragglers(a.job, a.idx, a.onset_step, rel=True)
            thin = bool(stragglers) and stragglers[0].instances < 2 * cfg.straggler.min_instances
            long_colls = np.nanmax(a.med, initial=-np.inf) >= math.log(RECHECK_LATENCY_SHARE * self._window_s)
            if stragglers and (thin or long_colls):
                # a rank named from the onset window alone, on few instances or on collectives
                # long against the window (partly the old regime's, or in flight when the change
                # began: the shortest rank of such an instance is not the straggler) is named
                # again on the next window, which must confirm the shift
                wait = "rank_rechecks"
        if (wait is None and cfg.fusion.onset_wait and not a.confirmed and not a.peak
                and self._mixed(a.idx, a.med, a.level)):
            # the alarm window holds the onset part-way through (p90 at the new level, p50 barely
            # moved): neither kind nor magnitude would be the event's; judged on the next window
            wait = "onset_waits"
        if wait is not None:
            self.counters[wait] += 1
            self.pending.append(a.pending(ws.t, peak=True))
        return wait, stragglers
