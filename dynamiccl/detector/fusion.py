"""Fusion: per-stream CUSUM alarms (+ autoencoder and rank evidence) → one `RegimeChange` per event.

Per window, after `dynamiccl.detector.streams.StreamTable.update`:

1. **Alarms are grouped** by (job, direction). Streams already in an active incident are
   absorbed into it (a ramp or a lagging stream never makes a second change); alarms within
   ``merge_s`` of an incident's detection or onset, or on a communicator the incident already
   covers, or within ``merge_similar_s`` of its onset with a similar shift (a wave of alarms
   over a big job), same job and direction, join it. 40 streams firing on one congestion event are one
   change.
2. **Evidence.** A new group becomes an incident at once when its shift is ≥ ``persist_ratio``
   and ≥ ``corroborate`` streams (with whole, settled windows) fired together, or when a
   straggler rank is visible. Otherwise (a lone alarm, or a small shift that a one-window
   hiccup could also cause) it waits up to ``confirm_windows`` windows for confirmation (values
   again ≥ ``confirm_z`` old sigmas away; two windows let an on/off bursty regime confirm); an
   unconfirmed one restores the streams' old baselines (no blind re-warm-up). Shifts below
   ``min_ratio`` are not regime changes (with ``small_shift_wait``, off by default, an
   unconfirmed group below it waits the same way: its alarm window may hold the onset). The per-stream CUSUM false-alarm rate is scaled with
   the number of streams (`StreamTable`), so more streams do not mean more false alarms. The
   job's autoencoder score and threshold go into the change's evidence (it flags one-window
   hiccups as readily as onsets, so it does not shorten the confirmation).
3. **The change** gets its onset from the CUSUM's last reset point (``change_start``, the first
   window of the alarming excursion), its kind (flapping if the same streams re-degrade soon
   after a recovery; straggler when one rank dominates the shortest durations or, the change
   being already justified, has by far the shortest durations relative to its peers; else
   bandwidth vs latency from the size response, `dynamiccl.detector.classify`; a degradation first seen,
   with a big shift, in the window holding its onset — partly the old regime — is classified
   one window later, `rank_waits`; so is a straggler named from that window alone,
   `straggler_recheck`, counter `rank_rechecks`), its magnitude (median new/old latency
   ratio over the fired streams) and where (communicators, collectives, size buckets, hosts,
   ranks).
4. **Tracking.** Each window, an incident's streams are placed between their old baseline (0)
   and their degraded level (1). ``recovery_windows`` consecutive windows at ≤
   ``recovery_fraction`` emit a ``recovery`` change (``recovers`` = the incident's id) and
   restore the streams' old baselines at once; ``flap_transitions`` off→on transitions within
   ``flap_window_s`` emit one ``flapping`` change.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from .classify import classify_size_response
from .config import DetectorConfig
from .events import RegimeChange
from .straggler import STRAGGLER_REL_Z, RankHistory, comm_hosts, find_stragglers, has_rank_evidence
from .steps import StepRule
from .tracking import Tracking
from .streams import StreamTable, WindowStreams

__all__ = ["Fusion", "Incident"]

MAX_INCIDENTS_PER_JOB = 64
MAX_PENDING = 4096
MAX_EVIDENCE_STREAMS = 12
MAX_SILENT = 64            # windows a pending group may wait for its streams' next value


@dataclass
class Incident:
    id: str
    job: str
    kind: str
    direction: int
    streams: np.ndarray
    base_med: np.ndarray
    base_scale: np.ndarray
    level: np.ndarray
    onset_step: int
    detected_step: int
    change: RegimeChange
    off_count: int = 0
    on: bool = True
    onsets: list[int] = field(default_factory=list)
    flapping_id: str | None = None
    closed_step: int | None = None
    rank_of: tuple[int, int] | None = None     # (comm_hash, rank): opened by rank evidence alone
    step_ids: list[str] = field(default_factory=list)   # deeper / softer steps (`dynamiccl.detector.steps`)

    @property
    def ids(self) -> list[str]:
        return [self.id] + ([self.flapping_id] if self.flapping_id else []) + self.step_ids

    def add(self, idx, med, scale, level) -> None:
        new = ~np.isin(idx, self.streams)
        if new.any():
            self.streams = np.concatenate([self.streams, idx[new]])
            self.base_med = np.concatenate([self.base_med, med[new]])
            self.base_scale = np.concatenate([self.base_scale, scale[new]])
            self.level = np.concatenate([self.level, level[new]])

    def drop(self, idx) -> None:
        keep = ~np.isin(self.streams, idx)
        self.streams, self.base_med = self.streams[keep], self.base_med[keep]
        self.base_scale, self.level = self.base_scale[keep], self.level[keep]


# collectives whose baseline latency is at least this share of a window are long against it
# (the test bed's: 2-60 % of 0.5 s; the simulated jobs': <= 0.5 % of 1 s): many of the onset
# window's instances were in flight when the change began (`straggler_recheck`)
RECHECK_LATENCY_SHARE = 0.02


@dataclass
class _Pending:
    job: str
    direction: int
    idx: np.ndarray
    med: np.ndarray
    scale: np.ndarray
    start: np.ndarray
    step: int
    tries: int = 0
    silent: int = 0        # windows without a value of its streams (not tries)
    peak: bool = False     # judged on its alarm window once confirmed (deferred for rank evidence)


class Fusion(Tracking):
    """Turns one window's stream alarms into regime changes; keeps incidents per job."""

    def __init__(self, config: DetectorConfig, table: StreamTable, ranks: RankHistory):
        self.config = config
        self.table = table
        self.ranks = ranks
        self.active: dict[str, list[Incident]] = {}
        self.closed: dict[str, deque] = {}
        self.stream_incident: dict[int, Incident] = {}
        self.pending: list[_Pending] = []
        self.counters = {"spikes_suppressed": 0, "small_shifts": 0, "alarms_absorbed": 0,
                         "alarms_merged": 0, "incidents_dropped": 0, "pending_dropped": 0,
                         "workload_changes": 0, "autoencoder_flags": 0, "network_only": 0,
                         "rank_triggers": 0, "rank_waits": 0, "small_waits": 0,
                         "rank_rechecks": 0, "onset_waits": 0}
        self._n: dict[str, int] = {}
        self._rebased_at: dict[str, int] = {}
        self.steps = StepRule(config, table, self._next_id, self.counters)
        self._step_fresh: list = []

    def _next_id(self, job: str) -> str:
        n = self._n.get(job, 0) + 1
        self._n[job] = n
        return f"rc-{job}-{n}"

    # ------------------------------------------------------------------ public
    def active_changes(self) -> list[RegimeChange]:
        return [inc.change for incs in self.active.values() for inc in incs]

    def process(self, ws: WindowStreams, window_s: float, ae: dict[str, tuple[float, float]] | None = None
                ) -> list[RegimeChange]:
        ae = ae or {}
        out: list[RegimeChange] = []
        self._window_s = window_s
        if ws.rebased.size:
            self._forget_streams(ws.rebased)
            # a workload change moves the job's other streams (arrival coupling) only if
            # its collectives take a real share of the job's time: a scalar AllReduce
            # changing size every few seconds is not a reason to ignore alarms; nor is a
            # stream's coverage alone (one window short of a rank's records: a collective
            # straddling the window's end), which changes no one's timing
            resized = ws.rebased if ws.resized is None else ws.resized
            for j in set(self.table.job[resized].tolist()):
                if self._time_share(j, resized) >= self.config.workload_settle_share:
                    self._rebased_at[j] = ws.t
        groups = self._confirm_pending(ws)
        self._step_fresh = []
        self._group_alarms(ws, groups)
        live = {id(inc) for incs in self.active.values() for inc in incs}
        out += self.steps.process(ws, window_s, self._step_fresh, live)
        created = set()
        for (job, direction), g in groups.items():
            inc, change = self._new_or_merge(ws, job, direction, g, ae)
            if change is not None:
                out.append(change)
            if inc is not None:
                created.add(inc.id)
        for inc, change in self._rank_trigger(ws, ae):
            out.append(change)
            created.add(inc.id)
        for job in list(self.active):
            for inc in list(self.active[job]):
                if inc.id not in created:
                    ch = self._track(ws, inc)
                    if ch is not None:
                        out.append(ch)
        return out

    # ------------------------------------------------------------------ steps
    def _forget_streams(self, idx: np.ndarray) -> None:
        for i in idx.tolist():
            inc = self.stream_incident.pop(i, None)
            if inc is not None:
                # its pre-change baseline is the one of the workload it left
                j = np.flatnonzero(inc.streams == i)
                if j.size and np.isfinite(inc.base_scale[j[0]]) and inc.base_scale[j[0]] > 0:
                    self.table.adopt_previous([i], inc.base_med[j[0]], inc.base_scale[j[0]])
                inc.drop(np.array([i]))
        for p in self.pending:
            keep = ~np.isin(p.idx, idx)
            p.idx, p.med, p.scale, p.start = p.idx[keep], p.med[keep], p.scale[keep], p.start[keep]

    def _confirm_pending(self, ws: WindowStreams) -> dict:
        groups: dict[tuple[str, int], dict] = {}
        keep = []
        for p in self.pending:
            if p.idx.size == 0:
                continue
            cur = self.table.current(p.idx)
            ok = np.isfinite(cur)
            if ok.any():
                z = (cur[ok] - p.med[ok]) / p.scale[ok] * p.direction
                if np.median(z) >= self.config.confirm_z:
                    g = groups.setdefault((p.job, p.direction), _new_group())
                    _extend(g, p.idx, p.med, p.scale, p.start, confirmed=True)
                    g["peak"] = g.get("peak", False) or p.peak
                    continue
            # not (yet) confirmed: a bursty regime (on/off every window) gets a second window;
            # a one-window hiccup does not come back. A window with no value of its streams (a
            # sparse stream between samples, `dynamiccl.detector.sparse`) is no try, up to MAX_SILENT;
            # a dense stream's silence is a pause, and its alarm is judged as before
            with np.errstate(invalid="ignore"):
                sparse = bool((self.table.instances_ref[p.idx] < self.config.min_instances).all())
            if not ok.any() and sparse and p.silent < MAX_SILENT:
                p.silent += 1
                keep.append(p)
                continue
            p.tries += 1
            if p.tries < self.config.confirm_windows:
                keep.append(p)
            else:
                self.table.restore_baseline(p.idx, p.med, p.scale)
                self.counters["spikes_suppressed"] += 1
        self.pending = keep
        return groups

    def _group_alarms(self, ws: WindowStreams, groups: dict) -> None:
        if ws.fired.size == 0:
            return
        tab = self.table
        si = self.stream_incident
        fired = ws.fired
        new = np.fromiter((i not in si for i in fired.tolist()), bool, fired.size)
        self.counters["alarms_absorbed"] += int(fired.size - new.sum())
        if not new.all():          # alarms of an incident's streams: a deeper or softer step?
            old = np.flatnonzero(~new)
            self._step_fresh = self.steps.collect(ws, old, [si[int(fired[p])] for p in old.tolist()])
        if not new.any():
            return
        codes = tab.job_code[fired].astype(np.int64) * 2 + (ws.direction > 0)
        for code in np.unique(codes[new]).tolist():
            m = new & (codes == code)
            first = int(fired[np.argmax(m)])
            g = groups.setdefault((tab.job[first], 1 if code % 2 else -1), _new_group())
            _extend(g, fired[m], ws.base_median[m], ws.base_scale[m], ws.start_step[m], confirmed=False)

    def _new_or_merge(self, ws, job, direction, g, ae):
        cfg, tab = self.config, self.table
        idx = np.concatenate(g["idx"])
        med = np.concatenate(g["med"])
        scale = np.concatenate(g["scale"])
        start = np.concatenate(g["start"])
        cusum_step = int(start.min())
        # the degraded level: this window's value (the excursion may start with noise windows)
        level = tab.current(idx)
        level = np.where(np.isfinite(level), level, tab.recent(idx, cusum_step))
        if g.get("peak"):
            # a big alarm held back one window for the straggler decision (`rank_waits`): a
            # bursty regime (incast, a flapping link) may be in an off phase by now; judge it
            # on the farthest window since its alarm, as it would have been judged at once
            peak = self._peak(idx, med, direction, ws.t - cfg.confirm_windows)
            level = np.where(np.isfinite(peak) & ((peak - med) * direction > (level - med) * direction),
                             peak, level)
        onset_step = self._refine_onset(idx, med, level, cusum_step, ws.t)
        # merge into a recent incident of the same job and direction
        comms_new = set(tab.comm_hash[idx].tolist())
        for old in self.closed.get(job, ()):
            if (old.direction == -direction and old.closed_step is not None
                    and (ws.t - old.closed_step) * self._window_s <= cfg.merge_s
                    and comms_new & set(tab.comm_hash[old.streams].tolist())):
                # the far side of a recovery seen late by a stream: part of it
                self.counters["alarms_absorbed"] += len(idx)
                tab.rebase(idx)
                return None, None
        for inc in self.active.get(job, []):
            if inc.direction != direction:
                continue
            near = min(ws.t - inc.detected_step, abs(onset_step - inc.onset_step)) * self._window_s
            # one active incident per communicator and direction: later streams of a comm that
            # is already degraded are the same event spreading, not a new one
            shared = bool(comms_new & set(tab.comm_hash[inc.streams].tolist()))
            # a wave of alarms over a big job: streams of other comms that fire a little later
            # with about the same shift are the same event
            with np.errstate(invalid="ignore"):
                inc_lr = float(np.nanmedian(inc.level - inc.base_med)) if inc.streams.size else float("nan")
                new_lr = float(np.nanmedian(level - med))
            similar = (math.isfinite(inc_lr) and math.isfinite(new_lr) and inc_lr != 0.0
                       and abs(new_lr - inc_lr) <= 0.5 * abs(inc_lr)
                       and (ws.t - inc.onset_step) * self._window_s <= cfg.merge_similar_s)
            if near <= cfg.merge_s or shared or similar:
                inc.add(idx, med, scale, level)
                for i in idx.tolist():
                    self.stream_incident[i] = inc
                self.counters["alarms_merged"] += len(idx)
                return None, None
        lr = (level - med) * direction
        if not np.nanmax(np.abs(lr), initial=0.0) >= math.log(cfg.min_ratio):
            if cfg.small_shift_wait and not g["confirmed"] and len(self.pending) < MAX_PENDING:
                # an early alarm's window may still be half the old regime (the onset inside
                # it): judge the shift on the next windows, which must confirm it (≥ confirm_z
                # old sigmas) or the old baselines come back (the default was a blind re-learn)
                self.counters["small_waits"] += 1
                self.pending.append(_Pending(job, direction, idx, med, scale, start, ws.t))
                return None, None
            self.counters["small_shifts"] += 1
            return None, None
        # a latency change explained by a change in message sizes is a workload change
        with np.errstate(invalid="ignore", divide="ignore"):
            moved = np.abs(np.log(tab.bytes_per_record[idx] / tab.bytes_ref[idx]))
            covm = np.abs(np.log(tab.coverage[idx] / tab.coverage_ref[idx]))
        explained = (np.isfinite(moved) & (moved >= 0.5 * np.abs(lr)) & (moved >= 0.01)) | (
            np.isfinite(covm) & (covm >= 0.5 * cfg.coverage_change) & tab.rank_set_changed[idx])
        # a workload change elsewhere in the job moves other streams' timing too (arrival
        # coupling): alarms in the few windows after one are part of it
        # (modest shifts only: such coupling moves latencies by a few per cent)
        recent_rebase = (ws.t - self._rebased_at.get(job, -(1 << 40)) <= cfg.workload_settle
                         and np.nanmax(np.abs(lr), initial=0.0) < math.log(cfg.workload_settle_ratio))
        if explained.sum() * 2 > len(idx) or recent_rebase:
            self.counters["workload_changes"] += 1
            tab.rebase(idx)
            if explained.sum() * 2 > len(idx) or self.config.workload_settle_chain:
                # a size change of its own; or (``workload_settle_chain``) a side effect, which
                # extends the settling time (fewer false alarms from arrival coupling while a
                # mix lasts, but one workload change can blind every stream of the job in turn)
                self._rebased_at[job] = ws.t
            return None, None
        ae_score, ae_thr = ae.get(job, (float("nan"), float("inf")))
        if ae_score > ae_thr:
            self.counters["autoencoder_flags"] += 1
        stragglers = None
        # streams whose window is partial (e.g. the job's last window, a pause starting) or that
        # just came back after a gap (the first steps after a checkpoint) are no evidence on
        # their own: their value waits for the next window
        with np.errstate(invalid="ignore", divide="ignore"):
            partial = (tab.instances[idx] < cfg.partial_window * tab.instances_ref[idx]) | (
                ws.t - tab.gap_step[idx] <= 1)
        full = int((~partial).sum())
        # a one-window job-wide hiccup (GC, OS jitter) moves many streams by a few per cent at
        # once: below ``persist_ratio`` a shift must persist one more window, however many
        # streams (or the autoencoder) agree
        big = np.nanmax(np.abs(lr), initial=0.0) >= math.log(cfg.persist_ratio)
        # The autoencoder flags hiccup windows as readily as event onsets, so its score is
        # evidence on the change (and a metric), not a reason to skip the confirmation window.
        evidence_ok = (g["confirmed"] and full >= 1) or (big and full >= cfg.corroborate)
        if not evidence_ok and full >= cfg.corroborate and self._network_only(job, idx[~partial], direction):
            # a job-wide hiccup moves the intra-node streams too; a network event leaves them
            # alone: multi-node streams alarming together while the job's intra-node streams
            # stay at their baseline need no second window
            evidence_ok = True
            self.counters["network_only"] += 1
        if not evidence_ok and direction > 0 and full >= 1:
            stragglers = self._stragglers(job, idx, onset_step)
            evidence_ok = bool(stragglers)
        if not evidence_ok:
            if len(self.pending) < MAX_PENDING:
                self.pending.append(_Pending(job, direction, idx, med, scale, start, ws.t))
            else:
                self.counters["pending_dropped"] += 1
                tab.restore_baseline(idx, med, scale)
            return None, None
        # judged one window later (pending, `peak`: on the farthest window since the alarm), with
        # the counter that says why
        wait = None
        if direction > 0 and ws.t <= onset_step and len(self.pending) < MAX_PENDING:
            if big and not g["confirmed"]:
                # seen in the window holding its onset (partly the old regime): without a straggler
                # there yet, the kind is decided one window later (`straggler.has_rank_evidence`);
                # a shift this big is confirmed by the next window unless it was a one-window hiccup
                stragglers = stragglers or self._stragglers(job, idx, onset_step, rel=True)
                if not stragglers and self._forming(job, idx, onset_step):
                    wait = "rank_waits"
            if wait is None and cfg.straggler_recheck and not g.get("peak"):
                stragglers = stragglers or self._stragglers(job, idx, onset_step, rel=True)
                thin = bool(stragglers) and stragglers[0].instances < 2 * cfg.straggler_min_instances
                long_colls = np.nanmax(med, initial=-np.inf) >= math.log(RECHECK_LATENCY_SHARE * self._window_s)
                if stragglers and (thin or long_colls):
                    # a rank named from the window holding the onset alone, on few instances (the test bed has
                    # 4-8 per window) or on collectives long against the window (the test bed's take
                    # 10-300 ms in 0.5 s windows): they are partly the old regime's or were in flight
                    # when the change began, and the shortest rank of such an instance is not the
                    # straggler (a test-bed run named the throttled rank's neighbour, 8 of 8
                    # instances); the change waits for the next window, which must confirm the
                    # shift, and is named on both
                    wait = "rank_rechecks"
            if (wait is None and cfg.onset_wait and not g["confirmed"] and not g.get("peak")
                    and self._mixed(idx, med, level)):
                # the alarms come from a window that holds the onset part-way through: a mix of both
                # regimes, its p90 already at the new level and its p50 barely moved (a 60 % bandwidth
                # loss starting mid-window read as 1.10x, its size-dependent streams not yet moved),
                # so neither the kind nor the magnitude would be the event's. The change is judged
                # on the next window (`onset_wait`); a window wholly in the new regime keeps its
                # p90/p50 spread and is judged at once.
                wait = "onset_waits"
        if wait is not None:
            self.counters[wait] += 1
            self.pending.append(_Pending(job, direction, idx, med, scale, start, ws.t, peak=True))
            return None, None
        return self._create(ws, job, direction, idx, med, scale, level, onset_step, ae_score, ae_thr,
                            stragglers)

    def _rank_trigger(self, ws: WindowStreams, ae) -> list:
        """A straggler without a latency alarm yet: in a communicator one rank was the strict
        shortest (its peers wait for it) in most instances of the last two windows, far beyond
        chance (binomial z ≥ ``straggler_trigger_z``), and not before; the communicator's
        latency rose (≥ ``min_ratio``, median z ≥ 1). Rank shares are overwhelming long before
        a small slowdown (5 % on a 64-rank job) is significant in the latency streams."""
        cfg, tab = self.config, self.table
        if cfg.straggler_trigger_z <= 0 or not self.ranks.frames or self.ranks.frames[-1][0] != ws.t:
            return []
        f = self.ranks.frames[-1][1]
        if "shortest_count" not in f.columns or f.height == 0:
            return []
        agg = f.group_by("job_id", "comm_hash").agg(pl.col("shortest_count").sum().alias("total"),
                                                      pl.col("shortest_count").max().alias("top"),
                                                      pl.len().alias("n"))
        agg = agg.filter((pl.col("n") >= 2) & (pl.col("total") >= cfg.straggler_min_instances)
                         & (pl.col("top") >= cfg.straggler_share * pl.col("total")))
        if agg.height == 0:
            return []
        out = []
        for job, comm, total, top, n in agg.iter_rows():
            p0 = 1.0 / n
            if (top - total * p0) / math.sqrt(total * p0 * (1.0 - p0)) < 0.5 * cfg.straggler_trigger_z:
                continue
            if any(inc.direction > 0 and int(comm) in set(tab.comm_hash[inc.streams].tolist())
                   for inc in self.active.get(job, [])):
                continue
            code = tab.jobs.get(job, -2)
            n_s = tab.n
            idx = np.flatnonzero(tab.active[:n_s] & (tab.job_code[:n_s] == code) & (tab.comm_hash[:n_s] == comm))
            idx = idx[~np.isin(idx, np.fromiter(self.stream_incident, np.int64, len(self.stream_incident)))]
            if idx.size == 0:
                continue
            med, scale = tab.baseline(idx)
            level = tab.current(idx)
            level = np.where(np.isfinite(level), level, tab.recent(idx, ws.t - 1))
            ok = np.isfinite(med) & np.isfinite(level) & (scale > 0)
            if not ok.any():
                continue
            idx, med, scale, level = idx[ok], med[ok], scale[ok], level[ok]
            lr = level - med
            if not (np.max(lr) >= math.log(cfg.min_ratio) and np.median(lr / scale) >= 1.0):
                continue
            cands = find_stragglers(self.ranks, job, {int(comm)}, onset_step=ws.t - 1,
                                    share=cfg.straggler_share, min_instances=2 * cfg.straggler_min_instances,
                                    later_alone=False)
            best = None
            for c in cands:
                if not (c.share_before == c.share_before and c.share_before < 0.5 * cfg.straggler_share):
                    continue                      # dominant before, or nothing known before
                p0 = 1.0 / n
                z = (c.share - p0) * c.instances / math.sqrt(c.instances * p0 * (1.0 - p0))
                if z >= cfg.straggler_trigger_z:
                    best = c
                    break
            if best is None:
                continue
            # the same straggler seen in another of its communicators, or just after another
            # change of this job: part of that change
            same = [inc for inc in self.active.get(job, []) if inc.direction > 0 and (
                (ws.t - inc.detected_step) * self._window_s <= cfg.merge_s
                or (inc.kind == "straggler" and best.host in inc.change.hosts))]
            if same:
                same[0].add(idx, med, scale, level)
                for i in idx.tolist():
                    self.stream_incident[i] = same[0]
                self.counters["alarms_merged"] += len(idx)
                continue
            onset = self._refine_onset(idx, med, level, ws.t - 2, ws.t)
            ae_score, ae_thr = ae.get(job, (float("nan"), float("inf")))
            self.counters["rank_triggers"] += 1
            inc, change = self._create(ws, job, 1, idx, med, scale, level, onset, ae_score, ae_thr,
                                       [best] + [c for c in cands if c is not best])
            change.evidence["trigger"] = "ranks"
            inc.rank_of = (best.comm_hash, best.rank)
            out.append((inc, change))
        return out

    def _peak(self, idx, med, direction, since_step: int) -> np.ndarray:
        """Per stream, its value farthest from ``med`` in ``direction`` from ``since_step`` to
        now (NaN without values)."""
        tab = self.table
        H = self.config.history
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
        allj = np.flatnonzero(tab.active[:n] & (tab.job_code[:n] == code))
        with np.errstate(invalid="ignore", over="ignore"):
            w_all = tab.instances[allj] * np.exp(tab.current(allj))
            mine = idx[tab.job_code[idx] == code]
            w_mine = tab.instances[mine] * np.exp(tab.current(mine))
        tot = float(np.nansum(w_all))
        return float(np.nansum(w_mine)) / tot if tot > 0 else 1.0

    def _network_only(self, job, idx, direction) -> bool:
        """All of ``idx`` are multi-node streams and the job's monitored intra-node streams
        (≥ ``corroborate`` of them, with a value this window) sit within ``quiet_z`` of their
        baseline (median, in the alarm's direction)."""
        tab, cfg = self.table, self.config
        if cfg.quiet_z <= 0 or idx.size == 0 or not (tab.nnodes[idx] > 1).all():
            return False
        code = tab.jobs.get(job, -2)
        n = tab.n
        ref = np.flatnonzero(tab.active[:n] & (tab.job_code[:n] == code) & (tab.nnodes[:n] == 1))
        if ref.size < cfg.corroborate:
            return False
        med, scale = tab.baseline(ref)
        cur = tab.current(ref)
        ok = np.isfinite(cur) & np.isfinite(med) & (scale > 0)
        if ok.sum() < cfg.corroborate:
            return False
        z = (cur[ok] - med[ok]) / scale[ok] * direction
        return float(np.median(z)) < cfg.quiet_z

    def _refine_onset(self, idx, med, level, cusum_step: int, t: int) -> int:
        """The CUSUM's last reset point, moved forward to the first window of the excursion
        already half-way to the new level (noise can start an excursion early)."""
        tab = self.table
        H = self.config.history
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
                               share=self.config.straggler_share,
                               min_instances=self.config.straggler_min_instances,
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

    def _create(self, ws, job, direction, idx, med, scale, level, onset_step, ae_score, ae_thr, stragglers):
        cfg, tab = self.config, self.table
        lr = level - med
        order = np.argsort(-np.abs(np.nan_to_num(lr)))
        idx, med, scale, level, lr = idx[order], med[order], scale[order], level[order], lr[order]
        comms_h = list(dict.fromkeys(tab.comm_hash[idx].tolist()))
        evidence: dict = {"n_streams": int(idx.size), "arl0": float(tab.arl0),
                          # the delay in instances of the change's collectives (onset window on)
                          "delay_instances": tab.instances_since(idx, onset_step)}
        kind = None
        ranks: list[int] = []
        hosts: list[str] = []
        if direction > 0:
            if not stragglers:
                stragglers = self._stragglers(job, idx, onset_step, rel=True)
            if stragglers:
                best = stragglers[0]
                evidence["stragglers"] = [
                    {"comm": f"0x{c.comm_hash:x}", "rank": c.rank, "host": c.host, "share": round(c.share, 3),
                     "instances": c.instances} for c in stragglers[:8]]
                if kind is None:
                    kind = "straggler"
                    comms_h = [best.comm_hash] + [c for c in comms_h if c != best.comm_hash]
                    ranks = [best.rank] + [c.rank for c in stragglers[1:] if c.host == best.host
                                           and c.comm_hash != best.comm_hash]
                    hosts = [best.host]
        if kind is None:
            kind, evidence["size_response"] = self._size_response(job, idx, med, scale, onset_step)
            # flapping: the same streams degrade again soon after a short episode recovered
            prev = self._recent_episode(job, idx, direction, ws.t)
            if prev is not None:
                evidence["previous"] = prev.ids
                kind = "flapping"
        if not hosts:
            hosts = self._hosts(job, comms_h)
        magnitude = float(np.exp(np.nanmedian(lr))) if np.isfinite(lr).any() else 1.0
        n = self._n.get(job, 0) + 1
        self._n[job] = n
        cid = f"rc-{job}-{n}"
        _, first = np.unique(tab.comm_hash[idx], return_index=True)
        names = {int(tab.comm_hash[idx[j]]): tab.comm_name[idx[j]] for j in first.tolist()}
        evidence["streams"] = [
            {"comm": f"0x{int(tab.comm_hash[i]):x}", "comm_name": tab.comm_name[i], "func": tab.func[i],
             "size_bucket": int(tab.size_bucket[i]), "ratio": round(float(np.exp(r)), 4),
             "z": round(float(r / s), 2) if s > 0 else None}
            for i, r, s in zip(idx[:MAX_EVIDENCE_STREAMS].tolist(), lr[:MAX_EVIDENCE_STREAMS].tolist(),
                               scale[:MAX_EVIDENCE_STREAMS].tolist())]
        if math.isfinite(ae_score):
            evidence["autoencoder_score"] = round(float(ae_score), 4)
            evidence["autoencoder_threshold"] = round(float(ae_thr), 4) if math.isfinite(ae_thr) else None
        change = RegimeChange(
            id=cid, kind=kind, job_id=job,
            start_s=float(tab.window_start_of(onset_step)), detected_s=float(ws.window_start + self._window_s),
            magnitude=round(magnitude, 4), comms=[f"0x{c:x}" for c in comms_h],
            comm_names=[names.get(c, "") for c in comms_h],
            funcs=sorted(set(tab.func[idx].tolist())),
            size_buckets=sorted(set(tab.size_bucket[idx].tolist())),
            ranks=ranks, hosts=hosts, evidence=evidence)
        inc = Incident(cid, job, kind, direction, idx, med, scale, level, onset_step, ws.t, change)
        self._register(job, inc)
        return inc, change

    def _recent_episode(self, job, idx, direction, t) -> Incident | None:
        """A closed incident of the same job and direction, on mostly the same streams, that
        lasted and ended within ``flap_window_s / 2``."""
        half = 0.5 * self.config.flap_window_s / self._window_s
        for old in reversed(self.closed.get(job, ())):
            if old.direction != direction or old.closed_step is None:
                continue
            if t - old.closed_step > half or old.closed_step - old.onset_step > half:
                continue
            overlap = np.isin(idx, old.streams).sum()
            if overlap >= 0.5 * min(len(idx), len(old.streams)):
                return old
        return None

    def _register(self, job: str, inc: Incident) -> None:
        lst = self.active.setdefault(job, [])
        lst.append(inc)
        for i in inc.streams.tolist():
            self.stream_incident[i] = inc
        if len(lst) > MAX_INCIDENTS_PER_JOB:
            old = lst.pop(0)
            self._release(old)
            self.counters["incidents_dropped"] += 1

    def _release(self, inc: Incident) -> None:
        for i in inc.streams.tolist():
            if self.stream_incident.get(i) is inc:
                del self.stream_incident[i]

    def _size_response(self, job, idx, med, scale, onset_step):
        """Classify bandwidth vs latency over the fired streams plus the job's other monitored
        multi-node streams (an unchanged small-message stream is evidence too)."""
        tab = self.table
        ids, meds, scales = [idx], [med], [scale]
        if (tab.nnodes[idx] > 1).any():
            # a network event: compare sizes on multi-node streams only (intra-node streams
            # only move through arrival coupling)
            multi = tab.nnodes[idx] > 1
            ids, meds, scales = [idx[multi]], [med[multi]], [scale[multi]]
            others = np.flatnonzero(tab.active & (tab.job_code == tab.jobs.get(job, -2)) & (tab.nnodes > 1))
            others = others[~np.isin(others, idx)]
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
        n_post = max(1, min(self.table.t - onset_step + 1, self.config.history))
        sigma = all_scale * math.sqrt(1.0 / n_post + 1.0 / self.config.warmup)
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


def _new_group() -> dict:
    return {"idx": [], "med": [], "scale": [], "start": [], "confirmed": False}


def _extend(g: dict, idx, med, scale, start, *, confirmed: bool) -> None:
    g["idx"].append(np.asarray(idx, np.int64))
    g["med"].append(np.asarray(med, np.float64))
    g["scale"].append(np.asarray(scale, np.float64))
    g["start"].append(np.asarray(start, np.int64))
    g["confirmed"] = g["confirmed"] or confirmed
